"""The in-process plan for Python models the operator trusts: offered only where the config allows it,
measured by selection beside a process per instance, and run in the daemon with Triton's per-request
and per-batch failures."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hardware_probe
from appliance.backends import BACKENDS, BackendRequest, LoadContext, RuntimeOptions
from appliance.backends.base import ModelCall
from appliance.backends.python.in_process import InProcessPythonBackend
from appliance.core.errors import InferenceFailed
from appliance.selection import Hardware, Selector
from appliance.selection.plans import IN_PROCESS_PLAN
from appliance.selection.selector import SelectionSettings
from tests.appliance.backends.python.harness import parse_config
from tests.models import copy_model, read_config

PYTHON = next(info for info in BACKENDS if info.name == "python")

# Module state and a relative import (factor.py, rewritten per load): two models with this same layout
# must not share either.
SCALE = "backends/scale"
CONFIG = read_config(SCALE)


def _load(tmp_path, name: str, factor: int, services=None) -> InProcessPythonBackend:
    model = copy_model(tmp_path, SCALE, name)
    (model.parent / "factor.py").write_text(f"FACTOR = {factor}\n")
    config = parse_config(CONFIG)
    config.name = name
    context = LoadContext(name, 1, model, config, RuntimeOptions(), services=services, plan=IN_PROCESS_PLAN.id)
    backend = PYTHON.load(context)
    assert isinstance(backend, InProcessPythonBackend)
    backend.configure(backend.completed_config(config))
    return backend


def _request(*values: float) -> BackendRequest:
    return BackendRequest({"IN": np.asarray([values], dtype=np.float32)}, ("OUT",))


def test_each_request_gets_its_answer_and_an_error_response_fails_only_its_request(tmp_path):
    backend = _load(tmp_path, "scale", 3)
    try:
        first, refused, second = backend.run_requests([_request(1, 2), _request(-1), _request(4)]).results
        assert np.array_equal(first["OUT"], [[3, 6]]) and np.array_equal(second["OUT"], [[12]])
        assert first.parameters == {"calls": 1, "by": "scale_0_0"}
        assert refused.status == 400 and refused.message == "negative"
    finally:
        backend.close()


def test_an_exception_in_execute_fails_its_batch_and_the_next_batch_runs(tmp_path):
    backend = _load(tmp_path, "scale", 3)
    try:
        results = backend.run_requests([_request(1), _request(99)]).results
        assert all(isinstance(r, InferenceFailed) and "ninety-nine" in str(r) for r in results)
        (result,) = backend.run_requests([_request(2)]).results
        assert np.array_equal(result["OUT"], [[6]])
    finally:
        backend.close()


def test_two_models_of_the_same_layout_keep_their_own_modules(tmp_path):
    one, two = _load(tmp_path / "a", "scale", 3), _load(tmp_path / "b", "scale", 5)
    try:
        assert np.array_equal(one.run_requests([_request(1)]).results[0]["OUT"], [[3]])
        assert np.array_equal(two.run_requests([_request(1)]).results[0]["OUT"], [[5]])
        assert one.run_requests([_request(1)]).results[0].parameters["calls"] == 2  # its own module's list
    finally:
        one.close()
        two.close()




class _Models:
    """The daemon's models as a backend calls them (BLS): doubles its input."""

    def begin(self, call: ModelCall, then) -> None:
        from appliance.backends.base import Outputs

        then(Outputs({"OUT": call.inputs["IN"] * 2}), None)


def test_bls_calls_and_is_cancelled_reach_the_daemon(tmp_path):
    from appliance.backends.base import BackendServices

    model = copy_model(tmp_path, "backends/bls_other", "caller")
    config = parse_config(CONFIG)
    config.name = "caller"
    backend = PYTHON.load(LoadContext("caller", 1, model, config, RuntimeOptions(),
                                      services=BackendServices(models=_Models()), plan=IN_PROCESS_PLAN.id))
    try:
        backend.configure(config)
        live = _request(1, 2)
        gone = dataclasses.replace(_request(3), cancelled=lambda: True)
        first, second = backend.run_requests([live, gone]).results
        assert np.array_equal(first["OUT"], [[2, 4]]) and first.parameters == {"cancelled": False}
        assert np.array_equal(second["OUT"], [[6]]) and second.parameters == {"cancelled": True}
    finally:
        backend.close()




@pytest.fixture(scope="module")
def selector():
    return Selector(Hardware.of(hardware_probe.probe(timeout=30)), None, SelectionSettings(budget=0.05))


@pytest.mark.parametrize(("parameter", "decoupled", "offered"), [
    ("true", False, True), ("", False, False), ("false", False, False), ("true", True, False)])
def test_the_in_process_plan_is_offered_only_where_the_config_allows_it(selector, parameter, decoupled, offered):
    config = parse_config('backend: "python"')
    if parameter:
        config.parameters["in_process"].string_value = parameter
    config.model_transaction_policy.decoupled = decoupled
    plans, _ = selector.plans_for(PYTHON, config)
    assert (IN_PROCESS_PLAN in plans) is offered
    assert plans[0].id == "python"  # a process per instance stays the reference


def test_selection_measures_both_plans_and_shows_them(tmp_path, selector):
    model = copy_model(tmp_path, "backends/double")
    config = parse_config(CONFIG)
    config.name = "double"
    choice = selector.choose(PYTHON, LoadContext("double", 1, model, config, RuntimeOptions()))
    rows = {row["plan"]: row for row in choice.decision["candidates"]}
    assert rows["python"]["status"] == "ok" and rows["python:in-process"]["status"] == "ok"
    assert rows["python:in-process"]["max_abs_error"] == 0.0
    assert choice.decision["chosen"] in rows
