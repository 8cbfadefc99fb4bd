"""NVIDIA GPUs (none on this box) and Jetson boards (on fake trees)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_probe.nvidia import probe_jetson, probe_nvidia


def test_no_gpu_here_is_absent_with_a_reason() -> None:
    nvidia = probe_nvidia()
    assert nvidia["status"] == "absent"
    assert nvidia["reason"]


def test_a_jetson_is_found_by_its_l4t_release(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    release = "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64"
    (tmp_path / "etc" / "nv_tegra_release").write_text(f"{release}\n# KERNEL_VARIANT: oot\n")
    jetson = probe_jetson(tmp_path)
    assert jetson["status"] == "present"
    assert jetson["l4t_release"] == release
    assert jetson["model"] is None


@pytest.mark.parametrize("board", ["NVIDIA Jetson Orin Nano Developer Kit", "Jetson-AGX"])
def test_a_jetson_is_found_by_its_device_tree_model(tmp_path: Path, board: str) -> None:
    (tmp_path / "proc" / "device-tree").mkdir(parents=True)
    (tmp_path / "proc" / "device-tree" / "model").write_text(board + "\x00")
    assert probe_jetson(tmp_path) == {"status": "present", "l4t_release": None, "model": board}


def test_another_board_is_no_jetson(tmp_path: Path) -> None:
    (tmp_path / "proc" / "device-tree").mkdir(parents=True)
    (tmp_path / "proc" / "device-tree" / "model").write_text("Raspberry Pi 5 Model B Rev 1.0\x00")
    assert probe_jetson(tmp_path)["status"] == "absent"


def test_an_empty_tree_has_no_jetson(tmp_path: Path) -> None:
    jetson = probe_jetson(tmp_path)
    assert jetson["status"] == "absent"
    assert "nv_tegra_release" in jetson["reason"]
