"""Triton's generate JSON mapping: top-level keys to inputs (shaped to the model's metadata shape) or
parameters, and responses flattened to one JSON object."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core.errors import InferenceFailed, InvalidInput
from appliance.engine.signature import ModelSignature, TensorSpec
from appliance.engine.types import InferOutput, InferResponse
from appliance.rest.codec import DecodeLimits, non_finite_token, output_text
from appliance.rest.generate_codec import (
    decode_generate_request,
    encode_generate_answer,
    encode_generate_response,
    sse_event,
)
from tests.appliance.strategies_fuzz import tensors


def _signature(max_batch_size: int = 0, **inputs: tuple[str, tuple[int, ...]]) -> ModelSignature:
    return ModelSignature(max_batch_size, {n: TensorSpec(n, d, dims) for n, (d, dims) in inputs.items()}, {})


def _decode(body: dict | bytes, signature: ModelSignature, limits: DecodeLimits | None = None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_generate_request(raw, signature, limits or DecodeLimits())


def test_text_input_and_parameters_as_triton_maps_them():
    signature = _signature(text_input=("BYTES", (1,)), max_tokens=("INT32", (1,)))
    request = _decode({"id": "42", "text_input": "client input", "max_tokens": 8,
                       "parameters": {"stream": False, "temperature": 0.5, "tag": "x"}}, signature)
    tensors = {t.name: t for t in request.inputs}
    assert tensors["text_input"].data.tolist() == [b"client input"] and tensors["text_input"].datatype == "BYTES"
    assert tensors["max_tokens"].data.dtype == np.int32 and tensors["max_tokens"].data.shape == (1,)
    assert request.id == "42"
    # 'id' is also a parameter, as in Triton (every key that is not an input is one).
    assert request.parameters == {"id": "42", "stream": False, "temperature": 0.5, "tag": "x"}


def test_an_input_may_hide_in_parameters():
    request = _decode({"parameters": {"IN": [1, 2]}}, _signature(IN=("INT32", (-1,))))
    assert request.inputs[0].data.tolist() == [1, 2] and request.parameters == {}


@pytest.mark.parametrize("dims, batched, count, shape", [
    ((-1,), False, 4, (4,)),
    ((2, -1), False, 6, (2, 3)),
    ((-1, -1), False, 5, (1, 5)),       # the innermost variable dimension takes the elements
    ((4,), True, 4, (1, 4)),            # the batch dimension (-1 first) is 1
    ((-1,), True, 3, (1, 3)),
    ((1,), False, 1, (1,)),             # a scalar
])
def test_lists_are_shaped_to_the_metadata_shape(dims, batched, count, shape):
    signature = _signature(4 if batched else 0, IN=("FP32", dims))
    value = list(range(count)) if count > 1 else 3
    request = _decode({"IN": value}, signature)
    assert request.inputs[0].data.shape == shape and request.inputs[0].data.dtype == np.float32


@pytest.mark.parametrize("body, words", [
    ({"IN": [1, 2, 3]}, "can not convert input 'IN' to tensor with proper shape"),
    ({"IN": [[1, 2], [3, 4]]}, "a value or a flat list"),
    ({"IN": [1.5, 2]}, "does not hold INT32 values"),
    ({"IN": [1, 2], "p": [1]}, "parameter 'p' has invalid type"),
    ({"IN": [1, 2], "p": {"a": 1}}, "parameter 'p' has invalid type"),
    ({"IN": [1, 2], "parameters": 3}, "Expected JSON object for keyword: 'parameters'"),
    ({"IN": [1, 2], "parameters": {"IN": [1, 2]}}, "given twice"),
    ({"IN": [1, 2], "id": 5}, "Unable to parse 'id'"),
    (b"[1, 2]", "must be a JSON object"),
    (b"{not json", "malformed JSON"),
])
def test_what_cannot_be_mapped_is_a_400_with_the_reason(body, words):
    with pytest.raises(InvalidInput, match=words):
        _decode(body, _signature(IN=("INT32", (2,))))


# Triton's words, as its qa suite (L0_http generate_endpoint_test) checks them: a value of the wrong JSON
# type in TritonJson's words, members taken in order, what is wrong inside 'parameters' said as such.
_LLM = {"PROMPT": ("BYTES", (1,)), "STREAM": ("BOOL", (1,))}


@pytest.mark.parametrize("body, words", [
    (b'{"PROMPT": 123, "STREAM": false}', "attempt to access JSON non-string as string"),
    (b'{"PROMPT": "hello", "STREAM": "false"}', "attempt to access JSON non-boolean as boolean"),
    (b'{"PROMPT": true, "STREAM": 123}', "attempt to access JSON non-string as string"),
    (b'{"STREAM": 123, "PROMPT": true}', "attempt to access JSON non-boolean as boolean"),
    (b'{"PROMPT": {"USER": "hi", "BOT": "ho"}, "STREAM": true}', "attempt to access JSON non-string as string"),
    (b'{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}', "input 'PROMPT' already exists in request"),
    (b'{"PROMPT": "a", "STREAM": false, "STREAM": false}', "input 'STREAM' already exists in request"),
    (b'{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}', "input 'STREAM' already exists in request"),
    (b'{"PROMPT": "a", "STREAM": true, "parameters": {"nested": {"twice": 1}}}',
     "Converting keyword: 'parameters': parameter 'nested' has invalid type."),
])
def test_refusals_in_tritons_words(body, words):
    with pytest.raises(InvalidInput) as info:
        _decode(body, _signature(**_LLM))
    assert words in info.value.message


def test_an_input_named_parameters_clashes_with_the_nested_keyword():
    with pytest.raises(InvalidInput, match="Keyword 'parameters' for nested schema also given as input tensor name"):
        _decode({"parameters": {}}, _signature(parameters=("INT32", (1,))))


def test_an_empty_body_is_an_empty_request():
    request = decode_generate_request(b"", _signature(), DecodeLimits())
    assert request.inputs == [] and request.parameters == {} and request.id is None


def test_element_count_is_bounded():
    with pytest.raises(InvalidInput, match="at most 4"):
        _decode({"IN": [1] * 5}, _signature(IN=("INT32", (-1,))), DecodeLimits(max_tensor_elements=4))


def test_a_response_is_one_flat_object_with_keys_sorted():
    response = InferResponse("m", 3, [
        InferOutput("text_output", "BYTES", np.array([b"hello"], dtype=object)),
        InferOutput("scores", "FP32", np.array([[0.5, 0.25]], np.float32)),
        InferOutput("model_name", "INT32", np.array([1], np.int32)),  # loses to the reserved key, as in Triton
    ], id="42", parameters={"tokens": 2, "done": True})
    body = encode_generate_response(response)
    document = json.loads(body)
    assert list(document) == sorted(document)
    assert document == {"id": "42", "model_name": "m", "model_version": "3", "text_output": "hello",
                        "scores": [0.5, 0.25], "tokens": 2, "done": True}
    assert "id" not in json.loads(encode_generate_response(InferResponse("m", 1, [])))


def test_bytes_that_are_not_text_cannot_be_json():
    response = InferResponse("m", 1, [InferOutput("out", "BYTES", np.array([b"\xff\xfe"], dtype=object))])
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        encode_generate_response(response)
    with pytest.raises(InferenceFailed, match="response parameters must be"):
        encode_generate_response(InferResponse("m", 1, [], parameters={"raw": b"\x00"}))


def test_server_sent_event_framing():
    assert sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'


# The element-wise encoder the chunked one replaced (a Python step per element, on the event loop): the
# reference it must match byte for byte.


def _reference_value(name: str, data: np.ndarray):
    if data.dtype == object:
        values = [output_text(name, item) for item in data.ravel()]
    else:
        values = data.ravel().tolist()
        if data.dtype.kind == "f" and not np.isfinite(data).all():
            values = [v if math.isfinite(v) else orjson.Fragment(non_finite_token(v)) for v in values]
    return values[0] if len(values) == 1 else values


def _reference(response: InferResponse) -> bytes:
    document = {output.name: _reference_value(output.name, output.data) for output in response.outputs}
    document.update(response.parameters)
    document["model_name"] = response.model_name
    document["model_version"] = str(response.model_version)
    if response.id:
        document["id"] = response.id
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


_JSON_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
                   "FP64", "BYTES")
_NAMES = st.sampled_from(["y", "id", "model_name", "tokens", "z", "é", "Y"])


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(arrays=st.lists(st.tuples(_NAMES, tensors(_JSON_DATATYPES, utf8=True)), max_size=4),
       parameters=st.dictionaries(_NAMES, st.one_of(st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                                                    st.text(max_size=4)), max_size=3),
       response_id=st.none() | st.text(max_size=4), big_endian=st.booleans())
def test_responses_are_byte_identical_to_the_element_wise_encoder(arrays, parameters, response_id, big_endian):
    """Any outputs (NaN and infinities too, colliding names, byte orders), parameters and id: the same text,
    keys sorted, as the encoder that wrote each element with a Python step."""
    outputs = [InferOutput(name, datatype, array.astype(array.dtype.newbyteorder(">")) if big_endian and
                           array.dtype != object else array) for name, (datatype, array) in arrays]
    response = InferResponse("m", 3, outputs, id=response_id, parameters=parameters)
    assert encode_generate_response(response) == _reference(response)


async def test_a_large_response_is_the_same_text_chunked_and_as_an_event():
    """Past a chunk of elements (BYTES) and past the off-loop threshold: the same text, and the event is
    sse_event of it."""
    floats = np.linspace(-1e30, 1e30, 300_001).astype(np.float32)
    floats[[7, 70_000, 300_000]] = [np.nan, np.inf, -np.inf]
    response = InferResponse("m", 1, [
        InferOutput("scores", "FP32", floats),
        InferOutput("text", "BYTES", np.array([f"t{i}".encode() for i in range(150_000)], dtype=object)),
        InferOutput("ids", "INT64", np.arange(-5, 200_000, dtype=np.int64)),
    ], id="7", parameters={"done": True})
    expected = _reference(response)
    assert await encode_generate_answer(response) == expected
    assert await encode_generate_answer(response, event=True) == sse_event(expected)
