from __future__ import annotations

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.engine.signature import ModelSignature, TensorSpec
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.engine.validation import validate_request

SIGNATURE = ModelSignature(
    max_batch_size=4,
    inputs={"a": TensorSpec("a", "FP32", (-1, 3)), "b": TensorSpec("b", "INT32", (2,), optional=True)},
    outputs={"y": TensorSpec("y", "FP32", (3,))},
)


def _request(*inputs, outputs=()):
    return InferRequest([InferInput(n, d, a) for n, d, a in inputs], [RequestedOutput(o) for o in outputs])


def test_valid_request_returns_its_batch_size():
    request = _request(("a", "FP32", np.zeros((3, 5, 3), np.float32)), ("b", "INT32", np.zeros((3, 2), np.int32)))
    assert validate_request("m", SIGNATURE, request) == 3


def test_optional_input_may_be_left_out():
    assert validate_request("m", SIGNATURE, _request(("a", "FP32", np.zeros((1, 1, 3), np.float32)))) == 1


# Triton's words (infer_request.cc), its request-id prefix included.
@pytest.mark.parametrize("inputs,outputs,message", [
    ([("a", "FP32", np.zeros((5, 1, 3), np.float32))], (),
     "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'm'"),
    ([("a", "FP32", np.zeros((1, 1, 4), np.float32))], (),
     "[request id: <id_unknown>] unexpected shape for input 'a' for model 'm'. Expected [-1,-1,3], got [1,1,4]. "
     "NOTE: Setting a non-zero max_batch_size"),
    ([("a", "FP64", np.zeros((1, 1, 3)))], (),
     "[request id: <id_unknown>] inference input 'a' data-type is 'FP64', but model 'm' expects 'FP32'"),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32)), ("b", "INT32", np.zeros((2, 2), np.int32))], (),
     "disagree on the batch size"),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32))] * 2, (),
     "[request id: <id_unknown>] input 'a' already exists in request"),
    ([("b", "INT32", np.zeros((1, 2), np.int32))], (),
     "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 1 inputs for model 'm'. Got "
     "input(s) ['b'], but missing required input(s) ['a']. Please provide all required input(s)."),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32)), ("b", "INT32", np.zeros((1, 2), np.int32)),
      ("c", "INT32", np.zeros((1, 2), np.int32))], (),
     "expected number of inputs between 1 and 2 but got 3 inputs for model 'm'. Got input(s) ['a','b','c'], but "
     "missing required input(s) ]."),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32)), ("c", "INT32", np.zeros((1, 2), np.int32))], (),
     "[request id: <id_unknown>] unexpected inference input 'c' for model 'm'"),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32))], ("z",), "unexpected inference output 'z' for model 'm'"),
    ([("a", "FP32", np.zeros((1, 1, 3), np.float32))], ("y", "y"), "output 'y' already exists in request"),
])
def test_invalid_requests(inputs, outputs, message):
    with pytest.raises(InvalidInput) as info:
        validate_request("m", SIGNATURE, _request(*inputs, outputs=outputs))
    assert message in info.value.message


def test_a_model_without_optional_inputs_expects_an_exact_count():
    signature = ModelSignature(max_batch_size=0, inputs={"a": TensorSpec("a", "FP32", (3,)),
                                                         "b": TensorSpec("b", "INT32", (2,))}, outputs={})
    with pytest.raises(InvalidInput) as info:
        validate_request("m", signature, _request(("b", "INT32", np.zeros(2, np.int32))))
    assert info.value.message == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['b'], but missing "
        "required input(s) ['a']. Please provide all required input(s).")


def test_the_prefix_names_the_request():
    request = _request(("a", "FP64", np.zeros((1, 1, 3))))
    request.id = "r-7"
    with pytest.raises(InvalidInput, match=r"^\[request id: r-7\] inference input 'a'"):
        validate_request("m", SIGNATURE, request)
