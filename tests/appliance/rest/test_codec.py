"""The v2 codec on its own: JSON and binary decoding, encoding, and the checks on claimed sizes."""

from __future__ import annotations

import json
import math
import struct

import ml_dtypes
import numpy as np
import orjson
import pytest

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.engine.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    SharedMemoryRef,
)
from appliance.rest.codec import (
    DecodeLimits,
    decode_bytes_tensor,
    decode_infer_request,
    encode_bytes_tensor,
    encode_infer_response,
    encoding_work,
    parse_json_object,
    plain_answer,
)


def _binary(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), len(head)


def test_json_flat_and_nested_data_give_the_same_tensor():
    flat = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}]}
    nested = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT64", "data": [[1, 2, 3], [4, 5, 6]]}]}
    a = decode_infer_request(json.dumps(flat).encode()).inputs[0].data
    b = decode_infer_request(json.dumps(nested).encode()).inputs[0].data
    assert a.dtype == np.int64 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, b)


def test_json_request_fields_are_kept():
    body = {
        "id": "abc",
        "parameters": {"priority": 2, "custom": "kept"},
        "inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["hé", "x"]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True, "classification": 2}}],
    }
    request = decode_infer_request(json.dumps(body).encode())
    assert request.id == "abc"
    assert request.parameters == {"priority": 2, "custom": "kept"}
    assert list(request.inputs[0].data) == ["hé".encode(), b"x"]
    assert request.outputs[0].name == "y" and request.outputs[0].classification == 2


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_final_response", "triton_x"])
def test_request_parameters_with_tritons_reserved_prefix_are_refused_as_triton_refuses_them(key):
    # Triton's HTTP front end (and L0_parameters' test_params_reserved_rejected): 400, these words.
    body = {"parameters": {key: "dummy-value"}, "inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                                            "data": [1.0]}]}
    for _ in range(2):  # refused again: only keys found free are remembered
        with pytest.raises(InvalidInput, match="parameter keys starting with 'triton_' are reserved for Triton usage"):
            decode_infer_request(json.dumps(body).encode())
    body["parameters"] = {"sequence_id": 3, key: "dummy-value"}  # beside keys a request sent before
    decode_infer_request(json.dumps({**body, "parameters": {"sequence_id": 3}}).encode())
    with pytest.raises(InvalidInput, match="reserved for Triton usage"):
        decode_infer_request(json.dumps(body).encode())


@pytest.mark.parametrize("datatype,dtype", [("FP16", np.float16), ("FP32", np.float32), ("UINT64", np.uint64),
                                            ("BOOL", np.bool_), ("INT8", np.int8), ("BF16", ml_dtypes.bfloat16)])
def test_binary_input_is_read_in_place(datatype, dtype):
    data = np.arange(6).astype(dtype).reshape(2, 3)
    header = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": datatype,
                          "parameters": {"binary_data_size": data.nbytes}}]}
    body, length = _binary(header, data.tobytes())
    tensor = decode_infer_request(body, length).inputs[0].data
    assert tensor.dtype == dtype
    np.testing.assert_array_equal(tensor, data)


def test_mixed_binary_and_json_inputs_in_order():
    a = np.array([1.5, 2.5], np.float32)
    strings = [b"one", b"", b"three"]
    raw_strings = b"".join(struct.pack("<I", len(s)) + s for s in strings)
    header = {"inputs": [
        {"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "j", "shape": [1], "datatype": "INT32", "data": [7]},
        {"name": "s", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw_strings)}},
    ]}
    body, length = _binary(header, a.tobytes(), raw_strings)
    request = decode_infer_request(body, length)
    np.testing.assert_array_equal(request.inputs[0].data, a)
    assert request.inputs[1].data.tolist() == [7]
    assert list(request.inputs[2].data) == strings


def test_bytes_tensor_round_trip():
    array = np.array([b"a", b"\xff\x00binary", b""], dtype=object)
    assert list(decode_bytes_tensor(encode_bytes_tensor(array), 3, "t")) == list(array)


@pytest.mark.parametrize("raw,count,triton", [
    # Triton's words, counting elements as Triton does (one that runs past the end counts).
    (struct.pack("<I", 5) + b"abc", 1, "input 't' for model 'm': BYTES element 0 claims 5 bytes, but only 3 remain"),
    (struct.pack("<I", 1) + b"a", 2, "expected 2 string elements for inference input 't' for model 'm', got 1"),
    (struct.pack("<I", 4) + b"abcd" + b"\0\0", 2, "expected 2 string elements for inference input 't' for model "
                                                  "'m', got 1"),
    (struct.pack("<I", 1) + b"ab", 1, "unexpected number of string elements 2 for inference input 't' for model "
                                      "'m', expecting 1"),
    (b"\x01\x00", 1, "expected 1 string elements for inference input 't' for model 'm', got 0"),
    (struct.pack("<I", 255) + b"abcd", 2, "expected 2 string elements for inference input 't' for model 'm', got 1"),
])
def test_bytes_tensor_rejects_inconsistent_lengths(raw, count, triton):
    with pytest.raises(InputMismatch) as info:
        decode_bytes_tensor(raw, count, "t")
    assert info.value.finish("m").message == f"[request id: <id_unknown>] {triton}"


def test_claimed_size_is_checked_before_anything_is_allocated():
    header = {"inputs": [{"name": "x", "shape": [2**20, 2**20], "datatype": "FP32",
                          "parameters": {"binary_data_size": 2**42}}]}
    body, length = _binary(header, b"\0" * 16)
    with pytest.raises(InvalidInput, match="max_tensor_elements"):
        decode_infer_request(body, length)
    with pytest.raises(InvalidInput, match="binary data remain"):  # past the element limit: the bytes
        decode_infer_request(body, length, DecodeLimits(max_tensor_elements=2**41))
    huge = {"inputs": [{"name": "x", "shape": [2**40, 2**40], "datatype": "FP32", "data": [1]}]}
    with pytest.raises(InvalidInput, match="exceed maximum size of .*at most 1073741824 elements are allowed"):
        decode_infer_request(json.dumps(huge).encode())


def test_input_count_is_bounded_and_any_data_nesting_with_the_right_count_is_accepted():
    many = {"inputs": [{"name": f"x{i}", "shape": [1], "datatype": "FP32", "data": [1]} for i in range(300)]}
    with pytest.raises(InvalidInput, match="300 inputs; at most 256"):
        decode_infer_request(json.dumps(many).encode())
    deep = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "INT32", "data": [[[[123]]]]}]}
    assert decode_infer_request(json.dumps(deep).encode()).inputs[0].data.tolist() == [[123]]  # as Triton
    ragged = {"inputs": [{"name": "x", "shape": [3], "datatype": "INT32", "data": [[1, 2], [3]]}]}
    with pytest.raises(InvalidInput, match="does not hold INT32"):
        decode_infer_request(json.dumps(ragged).encode())


@pytest.mark.parametrize("body,message", [
    (b"", "malformed JSON"),
    (b'{"inputs": {}}', "must have an 'inputs' list"),
    (b'{"outputs": []}', "must have an 'inputs' list"),
    (b'{"inputs": [5]}', "inputs[0] must be a JSON object"),
    (b'{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}', "needs a 'name'"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "BF16", "data": [1]}]}',
     "^receiving BF16 data via JSON is not supported. Please use the binary data format for input x$"),
    (b'{"inputs": [{"name": "x", "shape": [1.5], "datatype": "FP32", "data": [1]}]}', "non-negative integers"),
    (b'{"inputs": [{"name": "x", "shape": [true], "datatype": "FP32", "data": [1]}]}', "non-negative integers"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "UINT8", "data": [1, 300]}]}', "does not hold UINT8"),
    (b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1], [2, 3]]}]}', "does not hold"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}]}', "must be strings"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "id": 5}', "'id' must be"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],'
     b' "parameters": {"binary_data_size": 4}}]}', "no Inference-Header-Content-Length"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],'
     b' "outputs": [{"name": "y", "parameters": {"classification": -1}}]}', "classification"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",'
     b' "parameters": {"shared_memory_region": "r"}}]}', "needs shared_memory_byte_size"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",'
     b' "parameters": {"shared_memory_region": 5, "shared_memory_byte_size": 4}}]}', "name of a registered region"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",'
     b' "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": -4}}]}', "non-negative integer"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r",'
     b' "shared_memory_byte_size": 4, "shared_memory_offset": 1.5}}]}', "shared_memory_offset must be"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_byte_size": 4}}]}',
     "without shared_memory_region"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],'
     b' "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]}', "send it one way"),
])
def test_malformed_requests(body, message):
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_infer_request(body)


def _response() -> InferResponse:
    return InferResponse("m", 3, [
        InferOutput("f", "FP32", np.array([[1.5, 2.5]], np.float32)),
        InferOutput("s", "BYTES", np.array([b"ab", b"c"], dtype=object)),
        InferOutput("h", "FP16", np.array([0.5], np.float16)),
    ], id="r1")


def test_encode_json_response():
    body, length = encode_infer_response(_response())
    assert length is None
    document = json.loads(body)
    assert document["model_name"] == "m" and document["model_version"] == "3" and document["id"] == "r1"
    outputs = {o["name"]: o for o in document["outputs"]}
    assert outputs["f"] == {"name": "f", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}
    assert outputs["s"]["data"] == ["ab", "c"]
    assert outputs["h"]["data"] == [0.5]


def test_encode_binary_outputs_where_requested():
    request = InferRequest(inputs=[], outputs=[RequestedOutput("f", {"binary_data": True}),
                                               RequestedOutput("s", {"binary_data": True}),
                                               RequestedOutput("h", {"binary_data": False})])
    body, length = encode_infer_response(_response(), request)
    header = json.loads(body[:length])
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in header["outputs"]]
    assert sizes == [8, 4 + 2 + 4 + 1, None]
    raw = body[length:]
    np.testing.assert_array_equal(np.frombuffer(raw[:8], np.float32), [1.5, 2.5])
    assert list(decode_bytes_tensor(raw[8:], 2, "s")) == [b"ab", b"c"]


def test_bf16_outputs_go_binary_and_json_refuses_them_with_tritons_words():
    values = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    response = InferResponse("m", 1, [InferOutput("b", "BF16", values)])
    body, length = encode_infer_response(response, InferRequest(inputs=[], parameters={"binary_data_output": True}))
    header = json.loads(body[:length])
    assert header["outputs"][0]["datatype"] == "BF16" and body[length:] == values.tobytes()
    with pytest.raises(InvalidInput, match="^sending BF16 data via JSON is not supported. Please use the binary data "
                                           "format for output"):
        encode_infer_response(response)


def test_binary_data_output_makes_every_output_binary():
    request = InferRequest(inputs=[], parameters={"binary_data_output": True})
    body, length = encode_infer_response(_response(), request)
    header = json.loads(body[:length])
    assert all("data" not in o for o in header["outputs"])
    assert len(body) - length == sum(o["parameters"]["binary_data_size"] for o in header["outputs"])


def test_reserve_hears_each_allocation_before_it_happens():
    header = {"inputs": [
        {"name": "json", "shape": [2, 3], "datatype": "FP64", "data": [1, 2, 3, 4, 5, 6]},
        {"name": "view", "shape": [4], "datatype": "INT32", "parameters": {"binary_data_size": 16}},
        {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
    ]}
    body, length = _binary(header, np.arange(4, dtype=np.int32).tobytes())
    sizes: list[int] = []
    decode_infer_request(body, length, reserve=sizes.append)
    assert sizes[0] == 6 * 8 and sizes[1] == 0  # binary fixed-size tensors are views of the body
    assert sizes[2] >= 2 * 8  # at least the object array's pointers


def test_a_refused_reservation_stops_decoding_before_allocating():
    class Refused(Exception):
        pass

    def refuse(size: int) -> None:
        if size > 1000:
            raise Refused(size)

    body = json.dumps({"inputs": [{"name": "x", "shape": [100_000], "datatype": "FP64", "data": [0] * 100_000}]})
    with pytest.raises(Refused) as raised:
        decode_infer_request(body.encode(), reserve=refuse)
    assert raised.value.args[0] == 8 * 100_000


def test_a_shape_claim_alone_reserves_no_more_than_the_body_can_hold():
    sizes: list[int] = []
    # 2^27 FP64 elements claimed (1 GiB), one sent: the reservation is bounded by the body, and the
    # request fails for what it is, a shape/data mismatch.
    body = json.dumps({"inputs": [{"name": "x", "shape": [1 << 27], "datatype": "FP64", "data": [0.0]}]}).encode()
    with pytest.raises(InvalidInput, match="needs 134217728 elements, 'data' has 1"):
        decode_infer_request(body, reserve=sizes.append)
    assert sizes == [8 * len(body)]
    strings, length = _binary({"inputs": [{"name": "s", "shape": [1 << 27], "datatype": "BYTES",
                                           "parameters": {"binary_data_size": 8}}]}, b"\0" * 8)
    sizes.clear()
    with pytest.raises(InvalidInput):
        decode_infer_request(strings, length, reserve=sizes.append)
    assert sizes[0] <= 2 * 41  # at most two 4-byte length prefixes fit in 8 bytes


def test_tensors_in_shared_memory_are_described_not_read():
    body = json.dumps({
        "inputs": [{"name": "a", "shape": [2, 3], "datatype": "FP32",
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 24}},
                   {"name": "b", "shape": [1], "datatype": "INT32", "data": [7]},
                   {"name": "c", "shape": [1 << 20], "datatype": "BYTES",
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 9,
                                   "shared_memory_offset": 24}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64,
                                                 "shared_memory_offset": 8, "binary_data": False}},
                    {"name": "z"}],
    }).encode()
    reserved: list[int] = []
    request = decode_infer_request(body, reserve=reserved.append)
    assert [i.name for i in request.inputs] == ["b"] and sum(reserved) <= len(body)  # nothing sized by a claim
    assert request.shared_inputs == [
        SharedMemoryInput("a", "FP32", (2, 3), SharedMemoryRef("in", 24)),
        SharedMemoryInput("c", "BYTES", (1 << 20,), SharedMemoryRef("in", 9, 24)),
    ]
    assert request.outputs[0].shared_memory == SharedMemoryRef("out", 64, 8)
    assert request.outputs[1].shared_memory is None and request.uses_shared_memory


def test_outputs_written_to_shared_memory_carry_no_data_and_no_parameters():
    response = _response()
    response.outputs[0].shared_memory = SharedMemoryRef("out", 8)
    response.outputs[1].shared_memory = SharedMemoryRef("out", 7, 64)
    request = InferRequest([], [RequestedOutput("f"), RequestedOutput("s"),
                                RequestedOutput("h", {"binary_data": True})])
    body, length = encode_infer_response(response, request)
    outputs = {o["name"]: o for o in json.loads(body[:length])["outputs"]}
    # As Triton 2.51 answers (tests/oracle): the output is listed, its data went into the region.
    assert outputs["f"] == {"name": "f", "datatype": "FP32", "shape": [1, 2]}
    assert outputs["s"] == {"name": "s", "datatype": "BYTES", "shape": [2]}
    assert outputs["h"]["parameters"] == {"binary_data_size": 2}
    assert len(body) == length + 2  # only the binary output's bytes follow the header


@pytest.mark.parametrize("datatype, value", [("FP32", 1e39), ("FP32", -3.5e38), ("FP16", 70000.0)])
def test_a_float_beyond_its_type_is_refused_not_made_infinite(datatype, value):
    """Issue 22 (Low): FP32 1e39 in JSON became inf (docs promised 400)."""
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": [value]}]}
    with pytest.raises(InvalidInput, match=f"beyond {datatype}'s range"):
        decode_infer_request(orjson.dumps(body))
    body["inputs"][0]["data"] = [3.4e38 if datatype == "FP32" else 65504.0]  # the largest finite value fits
    assert np.isfinite(decode_infer_request(orjson.dumps(body)).inputs[0].data).all()


@pytest.mark.parametrize("datatype, data, shape", [("FP32", [[1.0, 1e39]], [1, 2]), ("FP32", [1.0, -1e39], [2]),
                                                    ("FP16", [[1, 70000]], [1, 2]), ("FP16", [1, -70000], [2])])
def test_a_float_beyond_its_type_is_refused_flat_or_nested(datatype, data, shape):
    """The range is checked by the list's own min and max when it is flat, by numpy's when nested."""
    body = {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]}
    with pytest.raises(InvalidInput, match=f"beyond {datatype}'s range"):
        decode_infer_request(orjson.dumps(body))


@pytest.mark.parametrize("length", [4, 300])  # a short list and one the doubles' path reads
@pytest.mark.parametrize("stranger, words", [(True, "got booleans among them"), (None, "mixed or unsupported"),
                                             ("0.5", "got strings"), ({"a": 1}, "mixed or unsupported"),
                                             ([0.5], "does not hold FP32")],
                         ids=["true", "null", "string", "object", "list"])
def test_a_value_that_is_not_a_number_among_floats_is_refused(length, stranger, words):
    """Beside numbers, a JSON true is no 1.0, a numeric string no number, null no NaN (Triton: 'attempt to
    access JSON non-number as double'), wherever it stands."""
    data = [0.5] * length
    data[length // 2] = stranger
    body = {"inputs": [{"name": "x", "shape": [length], "datatype": "FP32", "data": data}]}
    with pytest.raises(InvalidInput, match=words):
        decode_infer_request(orjson.dumps(body))


def test_a_float_past_fp32s_largest_that_rounds_to_it_is_taken_as_before():
    """Past the largest FP32 by less than half a step, a value rounds to it, not to infinity: the exact
    path (the cast under np.errstate) decides what the quick range check cannot."""
    largest = float(np.finfo(np.float32).max)
    for data in ([largest * (1 + 2**-26)], [[largest * (1 + 2**-26)]]):
        body = {"inputs": [{"name": "x", "shape": [1] if not isinstance(data[0], list) else [1, 1],
                            "datatype": "FP32", "data": data}]}
        assert decode_infer_request(orjson.dumps(body)).inputs[0].data.max() == np.float32(largest)


def test_non_finite_outputs_are_written_as_triton_writes_them():
    """Infinity, -Infinity and NaN as Triton's JSON has them (Python's json and tritonclient read them);
    binary outputs carry them exactly."""
    values = np.array([[1.5, np.inf, -np.inf, np.nan]], np.float32)
    response = InferResponse("m", 1, [InferOutput("y", "FP32", values)])
    body, json_length = encode_infer_response(response)
    assert json_length is None and b'"data":[1.5,Infinity,-Infinity,NaN]' in body
    decoded = json.loads(body)["outputs"][0]["data"]
    assert decoded[:3] == [1.5, float("inf"), float("-inf")] and math.isnan(decoded[3])
    finite = InferResponse("m", 1, [InferOutput("y", "FP32", np.array([[0.1, 2.0]], np.float32))])
    assert b'"data":[0.1,2.0]' in encode_infer_response(finite)[0]


@pytest.mark.parametrize("levels, refused", [(99, False), (101, False), (1000, False), (5000, True)])
def test_a_control_body_is_read_to_orjsons_depth_and_no_deeper(levels, refused):
    """What a deep body holds is judged by the handler (Triton 2.51 reads it whole: a deep 'ready' is 'not a
    boolean', as test_repository_index_deeply_nested_json sees); past orjson's bound, a clear refusal."""
    body = b'{"ready": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"  # the object is level 1
    if refused:
        with pytest.raises(InvalidInput, match=r"JSON nesting depth exceeds the maximum this server reads"):
            parse_json_object(body, 'a JSON object such as {"ready": true}')
    else:
        assert list(parse_json_object(body, "an object")) == ["ready"]


def test_a_plain_answer_is_only_what_the_event_loop_may_encode():
    """The lane writes a plain answer without asking encoding_work first: every output numeric and small
    enough together to encode on the loop; otherwise (too large, BYTES, binary asked for) it is left to the
    general path and the off-loop rule."""
    from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES

    def response(*arrays: np.ndarray) -> InferResponse:
        return InferResponse("m", 1, [InferOutput(f"y{i}", "FP32", a) for i, a in enumerate(arrays)])

    small = response(np.ones((1, 16), np.float32))
    assert plain_answer(small) == encode_infer_response(small)[0]
    split = response(*[np.ones(30_000, np.float32)] * 2)  # each alone would pass; together they are too many
    assert plain_answer(split) is None and encoding_work(split) > DECODE_OFF_LOOP_BYTES
    assert plain_answer(InferResponse("m", 1, [InferOutput("s", "BYTES", np.array([b"x"], dtype=object))])) is None
    binary = decode_infer_request(b'{"inputs": [], "parameters": {"binary_data_output": true}}')
    assert plain_answer(small, binary) is None


@pytest.mark.parametrize("dims", [[-1, 16], [1, -16], [-1, "a"], ["a", -2], [-1] + [1] * 70, [-1, 2.5]])
def test_a_shape_with_a_negative_dimension_is_refused_in_tritons_words_whatever_else_is_wrong(dims):
    body = json.dumps({"inputs": [{"name": "x", "shape": dims, "datatype": "FP32", "data": [0.0] * 16}]}).encode()
    with pytest.raises(InvalidInput, match="Unable to parse 'shape': attempt to access JSON non-unsigned-integer"):
        decode_infer_request(body, None, DecodeLimits())


@pytest.mark.parametrize("dims", [[1, "a"], [1] * 70, [1.5, 16], "16"])
def test_a_shape_wrong_otherwise_is_refused_in_the_shape_checks_words(dims):
    body = json.dumps({"inputs": [{"name": "x", "shape": dims, "datatype": "FP32", "data": [0.0] * 16}]}).encode()
    with pytest.raises(InvalidInput, match="'shape' must be a list of at most") as refused:
        decode_infer_request(body, None, DecodeLimits())
    assert "Unable to parse" not in str(refused.value)
