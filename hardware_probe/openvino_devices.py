"""OpenVINO's own view of the devices it can compile for."""

from __future__ import annotations

__all__ = ["list_openvino_devices"]


def list_openvino_devices() -> dict[str, str]:
    """Device name ("CPU", "GPU.0", "NPU") to its FULL_DEVICE_NAME. Raises ImportError without OpenVINO."""
    import openvino  # imported here: `import hardware_probe` must stay cheap and runtime-free

    core = openvino.Core()
    return {device: str(core.get_property(device, "FULL_DEVICE_NAME")) for device in core.available_devices}
