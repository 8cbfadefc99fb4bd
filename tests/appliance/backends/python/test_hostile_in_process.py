"""The in-process plan with a hostile model (tests/models/hostile): each wrong thing execute() returns
answers every request of the batch with Triton's error (HTTP 500, gRPC INTERNAL), is logged once, and the
model serves on; a request left unanswered (execute() returned None for it) is answered once let go of."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from appliance.backends import BACKENDS, BackendRequest, LoadContext, RuntimeOptions
from appliance.backends.python.in_process import InProcessPythonBackend
from appliance.selection.plans import IN_PROCESS_PLAN
from tests.appliance.backends.python.harness import answer_y, parse_config
from tests.appliance.backends.python.hostile_models import WRONG_RETURNS, failed, write_hostile

PYTHON = next(info for info in BACKENDS if info.name == "python")
IN_PROCESS = 'parameters { key: "in_process" value: { string_value: "true" } }\n'


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    model = write_hostile(tmp_path_factory.mktemp("hostile"), "hostile", "batched", IN_PROCESS)
    config = parse_config(model.parent.parent.joinpath("config.pbtxt").read_text())
    config.name = "hostile"
    backend = PYTHON.load(LoadContext("hostile", 1, model, config, RuntimeOptions(), plan=IN_PROCESS_PLAN.id))
    assert isinstance(backend, InProcessPythonBackend)
    backend.configure(backend.completed_config(config))
    yield backend
    backend.close()


def _request(mode: str, value: float = 1.0) -> BackendRequest:
    return BackendRequest({"MODE": np.array([[mode.encode()]], dtype=object),
                           "X": np.full((1, 2), value, np.float32)}, ("Y",))


@pytest.mark.parametrize("mode", sorted(WRONG_RETURNS))
def test_a_wrong_return_answers_each_request_with_tritons_error_and_the_model_serves_on(backend, mode):
    results = backend.run_requests([_request(mode), _request(mode)]).results
    for result in results:
        with pytest.raises(Exception, match=failed("hostile_0_0", mode)) as info:
            answer_y(result)
        assert info.value.status == 500
        assert getattr(info.value, "grpc_code", None) in (None, "INTERNAL")
    (echo,) = backend.run_requests([_request("echo", 3.0)]).results
    assert answer_y(echo) == [[3.0, 3.0]]


@pytest.mark.parametrize("mode", ["none", "raise"])
def test_each_kind_of_failure_is_logged_once_per_instance(backend, mode, caplog):
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            for result in backend.run_requests([_request(mode)]).results:
                with pytest.raises(Exception, match=re.escape("Failed to process the request(s)")):
                    answer_y(result)
    # The first failure of its kind is logged (by this test, or by an earlier one of the module), no other.
    assert len([record for record in caplog.records if record.levelno >= logging.ERROR]) <= 1
