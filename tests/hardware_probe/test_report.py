"""ProbeReport on this box (a CPU-only x86 or Arm host with onnxruntime, OpenVINO and torch for CPU)."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

from hardware_probe import ProbeReport, Step, probe
from hardware_probe.intel import probe_intel
from hardware_probe.nvidia import probe_jetson


def test_the_json_describes_cpu_memory_and_runtimes(report: ProbeReport) -> None:
    document = json.loads(json.dumps(report.to_json()))
    sections = document["sections"]
    assert sections["cpu"]["model"]
    assert sections["cpu"]["logical_threads"] >= 1
    assert sections["memory"]["total_bytes"] > 0
    assert "CPUExecutionProvider" in sections["runtimes"]["onnxruntime"]["loadable_providers"]
    assert "CPU" in sections["runtimes"]["openvino"]["devices"]
    assert document["fingerprint"] == report.fingerprint
    assert document["accelerators"] == ["cpu"]


def test_selection_helpers_read_the_runtimes(report: ProbeReport) -> None:
    assert "CPUExecutionProvider" in report.onnxruntime_providers()
    assert "AzureExecutionProvider" not in report.onnxruntime_providers()
    assert "CPU" in report.openvino_devices()
    assert report.cpu_flags() == report.sections["cpu"]["flags"]
    assert report.torch_cuda() is False
    assert report.tensorrt_version() is None
    versions = report.runtime_versions()
    assert {"onnxruntime", "openvino", "torch"} <= set(versions)
    assert "tensorrt" not in versions


def test_the_fingerprint_is_stable_across_probes(report: ProbeReport) -> None:
    assert re.fullmatch(r"[0-9a-f]{16}", report.fingerprint)
    assert probe(timeout=60).fingerprint == report.fingerprint


def test_the_table_names_every_section_and_the_cpu_model(report: ProbeReport) -> None:
    table = report.table()
    assert report.sections["cpu"]["model"] in table
    for row in ("cpu", "memory", "nvidia", "jetson", "intel", "onnxruntime", "openvino", "torch", "tensorrt"):
        assert re.search(rf"^{row}\s+(present|absent)", table, re.MULTILINE), row
    assert report.fingerprint in table


def test_the_summary_is_one_line_with_model_runtimes_and_fingerprint(report: ProbeReport) -> None:
    summary = report.summary()
    assert "\n" not in summary
    assert report.sections["cpu"]["model"] in summary
    assert "accelerators: cpu" in summary
    assert "onnxruntime" in summary and "CPUExecutionProvider" in summary
    assert summary.endswith(f"fingerprint {report.fingerprint}")


def test_accelerators_follow_what_the_steps_found(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.0\n")
    (tmp_path / "dev" / "dri").mkdir(parents=True)
    (tmp_path / "dev" / "dri" / "renderD128").touch()
    (tmp_path / "sys" / "class" / "drm" / "renderD128" / "device").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "drm" / "renderD128" / "device" / "vendor").write_text("0x8086\n")
    steps = [
        Step("jetson", partial(probe_jetson, tmp_path)),
        Step("intel", partial(probe_intel, tmp_path, ask_openvino=False)),
    ]
    assert probe(steps=steps).accelerators == ["cpu", "jetson", "intel-gpu"]


def test_a_report_of_odd_sections_still_renders() -> None:
    report = ProbeReport({"custom": {"status": "present", "value": 1}, "cpu": {"status": "present"}})
    assert '{"value": 1}' in report.table()
    assert report.accelerators == ["cpu"]
    assert report.onnxruntime_providers() == []
    assert "fingerprint" in report.summary()


def test_runtime_absences_say_why_each_runtime_is_missing():
    from hardware_probe.report import ProbeReport

    report = ProbeReport(sections={"runtimes": {
        "status": "present", "onnxruntime": {"status": "present", "version": "1.0"},
        "torch": {"status": "absent", "reason": "ImportError: no torch"}}})
    assert report.runtime_absences() == {"torch": "ImportError: no torch"}
    cut = ProbeReport(sections={"runtimes": {"status": "absent", "reason": "timed out after 60.0 s"}})
    assert cut.runtime_absences() == {"runtimes": "timed out after 60.0 s"}
