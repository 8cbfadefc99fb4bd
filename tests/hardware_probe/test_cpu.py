"""CPU and memory, on this box and on fake /proc trees of other architectures."""

from __future__ import annotations

from pathlib import Path

import psutil

from hardware_probe.cpu import probe_cpu, probe_memory

_X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx_vnni

processor\t: 1
vendor_id\t: GenuineIntel
"""

_ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 62.50
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve
CPU implementer\t: 0x41
CPU part\t: 0xd42
"""


def _write_tree(root: Path, cpuinfo: str, board: str | None = None) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(cpuinfo)
    if board is not None:
        (root / "proc" / "device-tree").mkdir()
        (root / "proc" / "device-tree" / "model").write_text(board + "\x00")
    return root


def test_this_cpu_is_described() -> None:
    cpu = probe_cpu()
    assert cpu["status"] == "present"
    assert cpu["model"]
    assert cpu["logical_threads"] == psutil.cpu_count(logical=True)
    assert cpu["architecture"]


def test_x86_flags_that_matter_are_kept_in_a_fixed_order(tmp_path: Path) -> None:
    cpu = probe_cpu(_write_tree(tmp_path, _X86_CPUINFO))
    assert cpu["vendor"] == "GenuineIntel"
    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu["flags"] == [
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
    ]


def test_arm_features_and_the_board_name_stand_in_for_x86_fields(tmp_path: Path) -> None:
    cpu = probe_cpu(_write_tree(tmp_path, _ARM_CPUINFO, board="NVIDIA Jetson AGX Orin Developer Kit"))
    assert cpu["vendor"] == "ARM"
    assert cpu["model"] == "NVIDIA Jetson AGX Orin Developer Kit"
    assert cpu["flags"] == ["asimd", "sve"]


def test_a_missing_cpuinfo_still_yields_a_section(tmp_path: Path) -> None:
    cpu = probe_cpu(tmp_path)
    assert cpu["status"] == "present"
    assert cpu["flags"] == []
    assert cpu["model"]


def test_memory_is_total_and_available_bytes() -> None:
    memory = probe_memory()
    assert memory["total_bytes"] >= memory["available_bytes"] > 0
