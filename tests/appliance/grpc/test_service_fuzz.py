"""Property-based fuzzing of ModelInfer as served (a message that came whole with its headers: admitted and
parsed on the event loop without a task, ``InferenceService.begin_infer``, then begun on the data plane's
straight line or handed to the awaited path): valid messages for a batching model and a sequence model,
built by tritonclient, then mutated on the wire (truncated, bytes flipped, inserted, deleted, duplicated,
length-like numbers written in). Whatever arrives, the call ends within its deadline with an answer or a
status a client is blamed for, never INTERNAL or UNKNOWN, and the server answers a valid call after it."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from appliance.examples import build_example_repository
from tests.appliance.strategies_fuzz import FEW, mutated
from tests.grpc_util import MODEL_INFER, channel
from tests.models import copy_model

pytestmark = pytest.mark.timeout(300)  # a hang fails the test instead of stalling CI

_CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                  grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED}
"""What a malformed or refused call may end with (UNAVAILABLE: a sequence without its START, say)."""


@pytest.fixture(scope="module")
def infer(module_in_process, tmp_path_factory):
    """ModelInfer on an in-process server with the example models and a Python sequence model."""
    repository = build_example_repository(tmp_path_factory.mktemp("service-fuzz") / "repo")
    copy_model(repository, "sequence/py_accumulator")
    server = module_in_process(repository, grpc=True)
    with channel(server.grpc_port) as opened:
        yield opened.unary_unary(MODEL_INFER)


def _message(model: str, values: np.ndarray, sequence: int, start: bool) -> bytes:
    if model == "simple":
        inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(values.reshape(1, 16))
    else:
        inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(values[:1].reshape(1, 1))
    return _get_inference_request(model_name=model, inputs=inputs, model_version="", request_id="", outputs=None,
                                  sequence_id=sequence if model != "simple" else 0,
                                  sequence_start=start and model != "simple", sequence_end=False, priority=0,
                                  timeout=None, parameters=None).SerializeToString()


@FEW
@given(model=st.sampled_from(["simple", "py_accumulator"]),
       values=st.lists(st.integers(-1000, 1000), min_size=16, max_size=16),
       sequence=st.integers(1, 64), start=st.booleans(), data=st.data())
def test_mutated_calls_are_answered_or_refused_as_the_clients_fault(infer, model, values, sequence, start, data):
    wire = data.draw(mutated(_message(model, np.array(values, np.int32), sequence, start)))
    try:
        answer = infer(wire, timeout=30)
    except grpc.RpcError as error:
        assert error.code() in _CLIENT_ERRORS, f"{error.code()}: {error.details()}"
    else:
        pb.ModelInferResponse.FromString(answer)  # an answer is a message
    valid = infer(_message("simple", np.arange(16, dtype=np.int32), 0, False), timeout=30)
    assert pb.ModelInferResponse.FromString(valid).model_name == "simple"
