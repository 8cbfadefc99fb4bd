"""The in-process plan on the event loop's own thread: which models may run there (a Python execute()
holds the GIL, so only its length counts), and a call that would wait for the loop, made from there,
refused (that batch fails, later ones run on the instance's thread) instead of a deadlock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from appliance.backends import BACKENDS, BackendRequest, LoadContext, RuntimeOptions
from appliance.backends.base import BackendServices, ModelCall, Outputs
from appliance.backends.python.factory import IN_PROCESS_PLAN_ID
from appliance.backends.python.in_process import InProcessPythonBackend
from appliance.core.errors import InferenceFailed
from tests.appliance.backends.python.harness import parse_config
from tests.models import copy_model, read_config

PYTHON = next(info for info in BACKENDS if info.name == "python")

DOUBLE = "backends/double"
CONFIG = read_config(DOUBLE)
# A negative input is answered by another model, through a helper module: model.py itself names no call
# that waits, so only the call, when it comes, can tell.
THROUGH_A_HELPER = "backends/through_a_helper"
# DOUBLE, naming a call that waits in code that never runs, or with a coroutine for execute().
WAITING = {
    "bls": "backends/double_names_bls",
    "async bls": "backends/double_names_async_bls",
    "load": "backends/double_names_load",
    "async execute": "backends/double_async_execute",
}


class _Models:
    """The daemon's models as a backend calls them (BLS): doubles its input, answered at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin(self, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
        self.calls.append(call.model_name)
        then(Outputs({"OUT": call.inputs["IN"] * 2}), None)


def _load(tmp_path, source: str, services: BackendServices | None = None) -> InProcessPythonBackend:
    model = copy_model(tmp_path, source, "m")
    config = parse_config(CONFIG)
    config.name = "m"
    backend = PYTHON.load(LoadContext("m", 1, model, config, RuntimeOptions(), services=services,
                                      plan=IN_PROCESS_PLAN_ID))
    assert isinstance(backend, InProcessPythonBackend)
    backend.configure(backend.completed_config(config))
    return backend


def _request(value: float) -> BackendRequest:
    return BackendRequest({"IN": np.asarray([[value]], dtype=np.float32)}, ("OUT",))


def _on_the_loop(backend: InProcessPythonBackend, request: BackendRequest):
    """One batch run on an event loop's own thread, as the scheduler runs an inline batch."""
    async def run():
        return backend.run_requests([request]).results[0]

    return asyncio.run(run())


def test_a_model_that_calls_no_other_model_may_run_on_the_loop(tmp_path):
    backend = _load(tmp_path, DOUBLE)
    try:
        assert backend.inline_safe is True and backend.holds_gil is True
        assert np.array_equal(_on_the_loop(backend, _request(3))["OUT"], [[6]])
    finally:
        backend.close()


@pytest.mark.parametrize("kind", sorted(WAITING))
def test_a_model_whose_code_names_a_waiting_call_never_runs_on_the_loop(tmp_path, kind):
    backend = _load(tmp_path, WAITING[kind])
    try:
        assert backend.inline_safe is False
        assert ("coroutine" if kind == "async execute" else "calls other models") in backend.inline_refusal
    finally:
        backend.close()


def test_a_waiting_call_made_on_the_loop_is_refused_and_later_batches_run_on_the_thread(tmp_path):
    models = _Models()
    backend = _load(tmp_path, THROUGH_A_HELPER, services=BackendServices(models=models))
    try:
        assert backend.inline_safe is True  # model.py names no waiting call
        answer = _on_the_loop(backend, _request(2))  # is_cancelled() is answered at once: it may run there
        assert np.array_equal(answer["OUT"], [[2]]) and answer.parameters == {"cancelled": False}

        refused = _on_the_loop(backend, _request(-1))  # the call would wait for the loop: refused, no hang
        assert isinstance(refused, InferenceFailed) and "event loop" in refused.message
        assert models.calls == []  # it never started
        assert backend.inline_safe is False and "event loop" in backend.inline_refusal

        (answer,) = backend.run_requests([_request(-1)]).results  # on a thread, as the scheduler now runs it
        assert np.array_equal(answer["OUT"], [[-2]]) and models.calls == ["other"]
    finally:
        backend.close()
