"""The CPU (vendor, model, cores, ISA flags that decide which kernels run) and memory."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil

__all__ = ["ISA_FLAGS", "probe_cpu", "probe_memory"]

# Flags that change which kernels onnxruntime, OpenVINO and torch pick, so they change both speed and
# whether a compiled artefact runs at all. The rest of /proc/cpuinfo's flags would only make the
# fingerprint fragile across microcode and kernel updates.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "avx_vnni",
    "neon",
    "asimd",
    "sve",
)

# Arm's cpuinfo names the designer only by its "CPU implementer" code.
_ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}


def _read_cpuinfo(root: Path) -> dict[str, str]:
    """The first value of every key; the first processor block describes them all on the boxes we serve."""
    try:
        text = (root / "proc" / "cpuinfo").read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _read_device_tree_model(root: Path) -> str | None:
    try:
        return (root / "proc" / "device-tree" / "model").read_text(errors="replace").strip("\x00\n ") or None
    except OSError:
        return None


def _pick_vendor(fields: dict[str, str]) -> str | None:
    if "vendor_id" in fields:
        return fields["vendor_id"]
    implementer = fields.get("CPU implementer", "").lower()
    return _ARM_IMPLEMENTERS.get(implementer, implementer or None)


def _pick_model(fields: dict[str, str], root: Path) -> str:
    # x86 says "model name"; many Arm kernels say nothing, so fall back to the board's name.
    for key in ("model name", "Model", "Hardware"):
        if fields.get(key):
            return fields[key]
    return _read_device_tree_model(root) or platform.processor() or platform.machine() or "unknown CPU"


def _pick_isa_flags(fields: dict[str, str]) -> list[str]:
    present = set(fields.get("flags", fields.get("Features", "")).split())
    return [flag for flag in ISA_FLAGS if flag in present]


def probe_cpu(root: str | os.PathLike[str] = "/") -> dict:
    """The CPU as /proc/cpuinfo under `root` describes it; core counts come from psutil (this box)."""
    fields = _read_cpuinfo(Path(root))
    return {
        "status": "present",
        "vendor": _pick_vendor(fields),
        "model": _pick_model(fields, Path(root)),
        "architecture": platform.machine(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_threads": psutil.cpu_count(logical=True),
        "flags": _pick_isa_flags(fields),
    }


def probe_memory() -> dict:
    memory = psutil.virtual_memory()
    return {"status": "present", "total_bytes": memory.total, "available_bytes": memory.available}
