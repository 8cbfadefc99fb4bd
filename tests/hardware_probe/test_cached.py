"""probe_cached(): a kept report serves while its key holds; anything odd means probing again."""

from __future__ import annotations

import json

import pytest

import hardware_probe.cached as cached
from hardware_probe import ProbeReport, probe_cached

SECTIONS = {"cpu": {"status": "present", "model": "test cpu"}, "memory": {"status": "present", "total_bytes": 1},
            "runtimes": {"status": "present", "onnxruntime": {"status": "present", "version": "1"}}}


@pytest.fixture
def probes(monkeypatch) -> list[float]:
    """Each probe a fake child process ran (its timeout); the report it returns is SECTIONS."""
    ran: list[float] = []

    def fake(timeout: float) -> ProbeReport:
        ran.append(timeout)
        return ProbeReport(json.loads(json.dumps(SECTIONS)))

    monkeypatch.setattr(cached, "probe_isolated", fake)
    return ran


def test_a_kept_report_serves_until_its_key_changes(tmp_path, probes, monkeypatch):
    path = tmp_path / "kept" / "hardware-probe.json"
    report, reused = probe_cached(path)
    assert not reused and report.sections["cpu"]["model"] == "test cpu" and path.is_file()
    report, reused = probe_cached(path)
    assert reused and report.sections["cpu"]["model"] == "test cpu" and len(probes) == 1
    assert report.sections["memory"]["total_bytes"] > 1  # read afresh: what is available moves
    monkeypatch.setattr(cached, "environment_key", lambda: "another boot")
    _, reused = probe_cached(path)
    assert not reused and len(probes) == 2


@pytest.mark.parametrize("content", [b"not json", b"[]", b'{"key": 1}', b"x" * (2 << 20)])
def test_a_kept_file_that_is_not_a_report_means_probing_again(tmp_path, probes, content):
    path = tmp_path / "hardware-probe.json"
    path.write_bytes(content)
    _, reused = probe_cached(path)
    assert not reused and len(probes) == 1
    assert json.loads(path.read_text())["key"] == cached.environment_key()  # replaced by a good one


def test_a_report_with_a_step_cut_off_is_used_once_never_kept(tmp_path, monkeypatch):
    cut = {**SECTIONS, "runtimes": {"status": "absent", "reason": "timed out after 60.0 s"}}
    monkeypatch.setattr(cached, "probe_isolated", lambda timeout: ProbeReport(cut))
    path = tmp_path / "hardware-probe.json"
    report, reused = probe_cached(path)
    assert not reused and report.sections["runtimes"]["status"] == "absent" and not path.exists()


def test_no_path_probes_every_time_and_an_unwritable_one_keeps_nothing(tmp_path, probes):
    probe_cached(None)
    probe_cached(None)
    blocked = tmp_path / "file"
    blocked.write_text("")
    report, reused = probe_cached(blocked / "hardware-probe.json")
    assert not reused and report.sections["cpu"]["model"] == "test cpu" and len(probes) == 3


def test_the_key_is_stable_and_follows_the_runtimes(monkeypatch):
    first = cached.environment_key()
    assert cached.environment_key() == first
    monkeypatch.setattr(cached, "_version", lambda name: "9.9" if name == "onnxruntime" else None)
    assert cached.environment_key() != first
