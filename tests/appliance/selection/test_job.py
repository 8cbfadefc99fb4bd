"""The job a tuning child gets survives its trip through JSON, and decisions are built one way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import LoadContext, RuntimeOptions
from appliance.selection import Hardware, Plan, SelectionSettings, TuneRequest
from appliance.selection.decision import ONLY_PLAN, build_decision, plan_from
from appliance.selection.job import TuningJob
from hardware_probe import ProbeReport


def _context() -> LoadContext:
    config = text_format.Parse('name: "m" max_batch_size: 8 parameters { key: "objective" value: '
                               '{ string_value: "throughput" } }', mc.ModelConfig())
    return LoadContext("m", 3, Path("/repo/m/3/model.onnx"), config,
                       RuntimeOptions(("CPUExecutionProvider",), 2), threads=2)


def test_a_tuning_job_round_trips_through_json():
    hardware = Hardware(ProbeReport(sections={"cpu": {"status": "present"}}), "f" * 16, {"onnxruntime": "1.2"},
                        ("avx2",))
    job = TuningJob("onnxruntime", _context(), hardware, SelectionSettings(budget=0.1, dynamic_sizes=(1, 2)),
                    Path("/state/cache"), 1 << 20, False, "key", TuneRequest(True, {"concurrency": 4}), nice=10)
    again = TuningJob.from_json(job.to_json())
    assert again.context == job.context  # protobuf messages compare by value
    assert again.hardware.as_json() == hardware.as_json() and again.hardware.probe.sections == hardware.probe.sections
    assert dataclasses.replace(again, context=job.context, hardware=hardware) == job


def test_a_decision_names_its_version_plan_and_box_and_gives_back_its_plan():
    plan = Plan("onnxruntime:CPU@2x1", "onnxruntime", (("threads", "1"),), instances=2, threads=1)
    row = {"plan": plan.id, "status": "ok"}
    decision = build_decision(_context(), "f" * 16, "throughput", plan, plan.id, [row], ONLY_PLAN, extra=1)
    assert decision["model"] == "m" and decision["version"] == 3 and decision["status"] == ONLY_PLAN
    assert decision["chosen"] == plan.id and decision["hardware_fingerprint"] == "f" * 16
    assert decision["candidates"] == [row] and decision["extra"] == 1
    assert plan_from(decision) == plan
