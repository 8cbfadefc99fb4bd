"""Intel iGPUs and NPUs on fake /dev and /sys trees; OpenVINO's view on this box."""

from __future__ import annotations

from pathlib import Path

from hardware_probe.intel import probe_intel


def _add_render_node(root: Path, name: str, vendor: str, device: str | None = None) -> None:
    (root / "dev" / "dri").mkdir(parents=True, exist_ok=True)
    (root / "dev" / "dri" / name).touch()
    sysfs = root / "sys" / "class" / "drm" / name / "device"
    sysfs.mkdir(parents=True)
    (sysfs / "vendor").write_text(vendor + "\n")
    if device is not None:
        (sysfs / "device").write_text(device + "\n")


def _add_accel_node(root: Path, name: str, driver: str) -> None:
    (root / "dev" / "accel").mkdir(parents=True, exist_ok=True)
    (root / "dev" / "accel" / name).touch()
    driver_dir = root / "sys" / "bus" / "pci" / "drivers" / driver
    driver_dir.mkdir(parents=True, exist_ok=True)
    sysfs = root / "sys" / "class" / "accel" / name / "device"
    sysfs.mkdir(parents=True)
    (sysfs / "driver").symlink_to(driver_dir)


def test_intel_render_nodes_and_npus_are_found(tmp_path: Path) -> None:
    _add_render_node(tmp_path, "renderD128", "0x8086", device="0x56a0")
    _add_render_node(tmp_path, "renderD129", "0x10de")  # an NVIDIA card beside it is not Intel's
    _add_accel_node(tmp_path, "accel0", "intel_vpu")
    _add_accel_node(tmp_path, "accel1", "habanalabs")

    intel = probe_intel(tmp_path, ask_openvino=False)

    assert intel["status"] == "present"
    assert intel["gpus"] == [{"path": "/dev/dri/renderD128", "pci_device_id": "0x56a0"}]
    assert intel["npus"] == [{"path": "/dev/accel/accel0", "driver": "intel_vpu", "pci_device_id": None}]


def test_an_empty_tree_has_no_intel_accelerator(tmp_path: Path) -> None:
    intel = probe_intel(tmp_path, ask_openvino=False)
    assert intel["status"] == "absent"
    assert "/dev/dri" in intel["reason"] and "/dev/accel" in intel["reason"]


def test_openvino_names_this_cpu() -> None:
    openvino = probe_intel()["openvino"]
    assert openvino["status"] == "present"
    assert openvino["devices"]["CPU"]
