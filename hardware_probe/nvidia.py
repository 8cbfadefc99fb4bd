"""NVIDIA GPUs as NVML sees them, and Jetson boards as their release files describe them."""

from __future__ import annotations

import os
from pathlib import Path

from hardware_probe.step import absent

__all__ = ["probe_jetson", "probe_nvidia"]


def _as_text(value: str | bytes) -> str:
    # nvidia-ml-py returned bytes before 11.5 and str since; accept both.
    return value.decode() if isinstance(value, bytes) else value


def _format_cuda_version(version: int) -> str:
    """NVML's 12040 is CUDA 12.4."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _describe_gpus(pynvml) -> list[dict]:
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        gpus.append(
            {
                "index": index,
                "name": _as_text(pynvml.nvmlDeviceGetName(handle)),
                "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "compute_capability": f"{major}.{minor}",
            }
        )
    return gpus


def probe_nvidia() -> dict:
    """Every GPU NVML reports; absent when nvidia-ml-py is not installed or NVML cannot start."""
    try:
        import pynvml
    except ImportError as exc:
        return absent(f"nvidia-ml-py is not installed ({exc}); install the nvidia flavour to see GPUs")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return absent(f"NVML did not start: {exc}")
    try:
        gpus = _describe_gpus(pynvml)
        driver = _as_text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _format_cuda_version(pynvml.nvmlSystemGetCudaDriverVersion())
    except pynvml.NVMLError as exc:
        return absent(f"NVML failed: {exc}")
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        return absent("NVML started but reports no GPU", driver_version=driver, cuda_driver_version=cuda)
    return {"status": "present", "driver_version": driver, "cuda_driver_version": cuda, "gpus": gpus}


def _read_first_line(path: Path) -> str | None:
    try:
        lines = path.read_text(errors="replace").strip("\x00\n ").splitlines()
    except OSError:
        return None
    return lines[0].strip() if lines else None


def probe_jetson(root: str | os.PathLike[str] = "/") -> dict:
    """A Jetson under `root`: L4T's /etc/nv_tegra_release, or a device-tree model naming NVIDIA or Jetson."""
    release = _read_first_line(Path(root, "etc", "nv_tegra_release"))
    model = _read_first_line(Path(root, "proc", "device-tree", "model"))
    if model is not None and "nvidia" not in model.lower() and "jetson" not in model.lower():
        model = None
    if release is None and model is None:
        return absent("no /etc/nv_tegra_release and no NVIDIA or Jetson board in /proc/device-tree/model")
    return {"status": "present", "l4t_release": release, "model": model}
