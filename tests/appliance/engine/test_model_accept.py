"""A version remembers the forms of request it found valid (one input, at most one output, nothing asked
of the output): a request of a remembered form is served without validating it again, and every other
request is refused exactly as ``validate_request`` refuses it, whatever came before."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.core.errors import InvalidInput
from appliance.engine.instances import InstancePool
from appliance.engine.model import ACCEPTED_FORMS, ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.engine.validation import validate_request
from appliance.repository.config import signature_of
from tests.fakes import FakeBackend

CONFIG = """
name: "double"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [-1] }]
"""


def _version() -> ModelVersion:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    stats = ModelStats()
    model = ModelVersion("double", 1, config, signature_of(config), named("onnxruntime"),
                         Scheduler("double:1", InstancePool("double:1", [FakeBackend()]), policy_from_config(config),
                                   stats), stats, selection={"status": "unmeasured"})
    model.start()
    return model


def _request(shape: tuple[int, ...], name: str = "x", datatype: str = "FP32", output: str | None = None,
             parameters: dict | None = None) -> InferRequest:
    data = np.ones(shape, np.float32 if datatype == "FP32" else np.int32)
    outputs = [] if output is None else [RequestedOutput(output, parameters or {})]
    return InferRequest([InferInput(name, datatype, data)], outputs, "r", {})


async def _refusal(model: ModelVersion, request: InferRequest) -> str | None:
    """What ``model`` says to ``request``: None when it served it, else its refusal's words."""
    try:
        await model.infer(request)
    except InvalidInput as refused:
        return refused.message
    return None


async def test_a_form_found_valid_is_served_again_and_every_other_form_still_checked():
    model = _version()
    try:
        for _ in range(3):
            assert await _refusal(model, _request((1, 3))) is None
            assert await _refusal(model, _request((2, 3), output="y")) is None
        assert "batch-size must be <= 4" in await _refusal(model, _request((5, 3)))
        assert "data-type is 'INT32'" in await _refusal(model, _request((1, 3), datatype="INT32"))
        assert "unexpected inference output 'z'" in await _refusal(model, _request((1, 3), output="z"))
        # A remembered form, but its output asks for a classification: checked, and refused when it is bad.
        negative = _request((2, 3), output="y", parameters={"classification": -1})
        assert "classification" in await _refusal(model, negative)
        assert await _refusal(model, _request((2, 3), output="y", parameters={"binary_data": True})) is None
        # Traffic is counted for every request served, remembered or not.
        assert model.traffic.requests == 7
        assert model.traffic.dominant() == ({"x": [3]}, 1.0)
    finally:
        await model.close(10)


async def test_the_forms_remembered_are_bounded():
    model = _version()
    try:
        for size in range(1, ACCEPTED_FORMS + 11):
            assert await _refusal(model, _request((1, size))) is None
        assert len(model._accepted) == ACCEPTED_FORMS
        assert await _refusal(model, _request((1, ACCEPTED_FORMS + 5))) is None  # one not remembered: checked
        assert "batch-size" in await _refusal(model, _request((9, ACCEPTED_FORMS + 5)))
        assert model.traffic.requests == ACCEPTED_FORMS + 11
    finally:
        await model.close(10)


_FORMS = st.tuples(
    st.sampled_from([(1, 3), (2, 3), (4, 1), (5, 3), (0, 3), (3,), (1, 2, 3)]),
    st.sampled_from(["x", "w"]),
    st.sampled_from(["FP32", "INT32"]),
    st.sampled_from([None, "y", "z"]),
    st.sampled_from([None, {"binary_data": True}, {"classification": 2}, {"classification": -1}]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_FORMS, min_size=1, max_size=12))
@example([((1, 3), "x", "FP32", "y", None), ((1, 3), "x", "FP32", "y", {"classification": -1})])
@example([((1, 3), "x", "FP32", None, None), ((1, 3), "x", "INT32", None, None)])
def test_any_sequence_of_requests_is_refused_exactly_as_validation_refuses_each(forms):
    async def run() -> None:
        model = _version()
        try:
            for shape, name, datatype, output, parameters in forms:
                request = _request(shape, name, datatype, output, parameters)
                try:
                    validate_request(model.name, model.signature, request)
                    expected = None
                except InvalidInput as refused:
                    expected = refused.message
                assert await _refusal(model, request) == expected
        finally:
            await model.close(10)

    asyncio.run(run())


@pytest.mark.parametrize("outputs", [[RequestedOutput("y"), RequestedOutput("y")],
                                     [RequestedOutput("y"), RequestedOutput("z")]])
async def test_a_request_of_no_form_is_validated_every_time(outputs):
    model = _version()
    try:
        for _ in range(2):
            request = InferRequest([InferInput("x", "FP32", np.ones((1, 3), np.float32))], outputs, "r", {})
            assert await _refusal(model, request) is not None
        assert not model._accepted
    finally:
        await model.close(10)
