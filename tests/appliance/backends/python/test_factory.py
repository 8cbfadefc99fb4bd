"""Which Python backend a model gets: the in-process one only for the plan selection chose
(``LoadContext.plan``), never for anything a config says (its parameters are the user's)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from appliance.backends import BACKENDS, BackendRequest, LoadContext, RuntimeOptions
from appliance.backends.python.backend import PythonBackend
from appliance.backends.python.factory import IN_PROCESS_PLAN_ID
from appliance.backends.python.in_process import InProcessPythonBackend
from appliance.selection.plans import IN_PROCESS_PLAN
from tests.appliance.backends.python.harness import parse_config
from tests.models import write_python_model

PYTHON = next(info for info in BACKENDS if info.name == "python")

PID = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.asarray([[os.getpid()]], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""
CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "python_plan" value: { string_value: "in-process" } }
"""


def _pid_of(tmp_path, plan: str) -> tuple[type, int]:
    model = write_python_model(tmp_path, "pid", PID, CONFIG)
    config = parse_config(CONFIG)
    config.name = "pid"
    backend = PYTHON.load(LoadContext("pid", 1, model, config, RuntimeOptions(), plan=plan))
    try:
        backend.configure(backend.completed_config(config))
        request = BackendRequest({"IN": np.zeros((1, 1), np.float32)}, ("PID",))
        (result,) = backend.run_requests([request]).results
        return type(backend), int(result["PID"].flat[0])
    finally:
        backend.close()


@pytest.mark.parametrize("plan", ["", "python"])
def test_the_old_marker_in_a_config_runs_no_model_in_the_daemon(tmp_path, caplog, plan):
    """No plan (selection off, or only one plan) or the process plan: a model process, whatever the
    config's parameters say; the marker is named in the log once, at the first instance's load."""
    with caplog.at_level(logging.WARNING, logger="appliance.backends.python.factory"):
        kind, pid = _pid_of(tmp_path, plan)
    assert kind is PythonBackend and pid != os.getpid()
    warned = [r for r in caplog.records if "python_plan" in r.getMessage()]
    assert len(warned) == (0 if plan else 1)


def test_the_plan_selection_chose_runs_the_model_in_the_daemon(tmp_path):
    kind, pid = _pid_of(tmp_path, IN_PROCESS_PLAN_ID)
    assert kind is InProcessPythonBackend and pid == os.getpid()


def test_the_in_process_plan_writes_nothing_a_config_could_write():
    config = parse_config('backend: "python"')
    assert IN_PROCESS_PLAN.id == IN_PROCESS_PLAN_ID and not IN_PROCESS_PLAN.parameters
    assert IN_PROCESS_PLAN.apply(config) == config
