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
from tests.models import copy_model, read_config

PYTHON = next(info for info in BACKENDS if info.name == "python")

MODEL = "backends/pid_batched"
"""Answers with the id of the process it runs in; its config names the old marker (python_plan)."""
CONFIG = read_config(MODEL)


def _pid_of(tmp_path, plan: str) -> tuple[type, int]:
    model = copy_model(tmp_path, MODEL, "pid")
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
