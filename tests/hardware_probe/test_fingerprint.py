"""The fingerprint changes with what makes an artefact valid, and with nothing else."""

from __future__ import annotations

import copy

from hardware_probe import ProbeReport
from hardware_probe.fingerprint import describe_fingerprint


def _with(report: ProbeReport, edit) -> ProbeReport:
    sections = copy.deepcopy(report.sections)
    edit(sections)
    return ProbeReport(sections)


def test_free_memory_does_not_change_the_fingerprint(report: ProbeReport) -> None:
    def halve_free_memory(sections: dict) -> None:
        sections["memory"]["available_bytes"] //= 2

    assert _with(report, halve_free_memory).fingerprint == report.fingerprint


def test_a_runtime_upgrade_changes_the_fingerprint(report: ProbeReport) -> None:
    def upgrade(sections: dict) -> None:
        sections["runtimes"]["onnxruntime"]["version"] = "99.0.0"

    assert _with(report, upgrade).fingerprint != report.fingerprint


def test_isa_flags_change_the_fingerprint(report: ProbeReport) -> None:
    def add_amx(sections: dict) -> None:
        sections["cpu"]["flags"] = [*sections["cpu"]["flags"], "amx_tile"]

    assert _with(report, add_amx).fingerprint != report.fingerprint


def test_what_is_hashed_leaves_out_memory(report: ProbeReport) -> None:
    described = describe_fingerprint(report.sections)
    assert set(described) == {"cpu", "nvidia", "jetson", "intel", "runtimes"}
    assert described["cpu"]["model"] == report.sections["cpu"]["model"]
    assert described["nvidia"] is None
