"""Intel iGPUs and NPUs, from the kernel's device nodes and from OpenVINO."""

from __future__ import annotations

import os
from pathlib import Path

from hardware_probe.openvino_devices import list_openvino_devices
from hardware_probe.step import RUNTIME_IMPORTS, absent

__all__ = ["find_intel_gpus", "find_intel_npus", "probe_intel"]

_INTEL_PCI_VENDOR = "0x8086"
_NPU_DRIVER = "intel_vpu"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _as_device_path(node: Path, root: Path) -> str:
    """The node's path on the probed system, so a fake tree reports /dev/dri/renderD128 too."""
    return "/" + node.relative_to(root).as_posix()


def find_intel_gpus(root: str | os.PathLike[str] = "/") -> list[dict]:
    """Render nodes under /dev/dri whose PCI vendor in sysfs is Intel."""
    root = Path(root)
    gpus = []
    for node in sorted((root / "dev" / "dri").glob("renderD*")):
        device = root / "sys" / "class" / "drm" / node.name / "device"
        if (_read_text(device / "vendor") or "").lower() == _INTEL_PCI_VENDOR:
            gpus.append({"path": _as_device_path(node, root), "pci_device_id": _read_text(device / "device")})
    return gpus


def _read_driver_name(device: Path) -> str | None:
    # readlink rather than resolve: on a real box the link is absolute (/sys/bus/pci/drivers/intel_vpu),
    # which would escape a fake tree; only its last component matters.
    try:
        return Path(os.readlink(device / "driver")).name
    except OSError:
        return None


def find_intel_npus(root: str | os.PathLike[str] = "/") -> list[dict]:
    """Compute accelerators under /dev/accel that the intel_vpu driver owns."""
    root = Path(root)
    npus = []
    for node in sorted((root / "dev" / "accel").glob("accel*")):
        device = root / "sys" / "class" / "accel" / node.name / "device"
        driver = _read_driver_name(device)
        if driver == _NPU_DRIVER:
            path = _as_device_path(node, root)
            npus.append({"path": path, "driver": driver, "pci_device_id": _read_text(device / "device")})
    return npus


def _ask_openvino() -> dict:
    try:
        with RUNTIME_IMPORTS:
            return {"status": "present", "devices": list_openvino_devices()}
    except Exception as exc:  # OpenVINO missing or its plugins failing must not hide the sysfs view
        return absent(f"{type(exc).__name__}: {exc}")


def probe_intel(root: str | os.PathLike[str] = "/", *, ask_openvino: bool = True) -> dict:
    """Intel GPUs and NPUs under `root`, plus OpenVINO's devices when `ask_openvino`.

    OpenVINO always describes this box, whatever `root` is; tests of a fake tree turn it off.
    """
    gpus = find_intel_gpus(root)
    npus = find_intel_npus(root)
    openvino = _ask_openvino() if ask_openvino else absent("not asked")
    openvino_accelerators = [d for d in openvino.get("devices", {}) if d.split(".")[0] in ("GPU", "NPU")]
    if not gpus and not npus and not openvino_accelerators:
        return absent(
            "no Intel render node in /dev/dri, no intel_vpu device in /dev/accel, no GPU or NPU in OpenVINO",
            gpus=[],
            npus=[],
            openvino=openvino,
        )
    return {"status": "present", "gpus": gpus, "npus": npus, "openvino": openvino}
