"""The gRPC codec on its own: typed contents and raw contents into core requests, responses back."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from appliance.core.errors import InvalidInput
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferOutput, InferResponse
from appliance.grpc.codec import (
    CONTENTS_FIELD,
    FINAL_RESPONSE,
    decode_infer_request,
    encode_infer_response,
    from_parameters,
    serialize_infer_response,
    serialize_stream_response,
    set_parameters,
)

NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
         "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": ml_dtypes.bfloat16}


def _request(*tensors: pb.ModelInferRequest.InferInputTensor, raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="r1", inputs=list(tensors))
    request.raw_input_contents.extend(raw or [])
    return request


def _tensor(name: str, datatype: str, shape: list[int]) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


@pytest.mark.parametrize("datatype", [d for d in CONTENTS_FIELD if d != "BYTES"])
def test_typed_contents_of_every_datatype(datatype):
    values = np.arange(6).astype(NUMPY[datatype]) if datatype != "BOOL" else np.array([1, 0, 1, 1, 0, 0], bool)
    tensor = _tensor("x", datatype, [2, 3])
    getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(values.tolist())
    decoded = decode_infer_request(_request(tensor))
    data = decoded.inputs[0].data
    assert data.dtype == NUMPY[datatype] and data.shape == (2, 3)
    np.testing.assert_array_equal(data.ravel(), values)
    assert decoded.id == "r1"


@pytest.mark.parametrize("datatype", list(NUMPY))
def test_raw_contents_of_every_datatype_are_read_in_place(datatype):
    values = (np.arange(8) % 2).astype(NUMPY[datatype])
    raw = values.tobytes()
    decoded = decode_infer_request(_request(_tensor("x", datatype, [2, 4]), raw=[raw]))
    data = decoded.inputs[0].data
    assert data.dtype == NUMPY[datatype] and data.shape == (2, 4)
    np.testing.assert_array_equal(data.ravel(), values)
    assert not data.flags.owndata  # a view of the bytes taken out of the message


def test_bytes_typed_and_raw():
    typed = _tensor("s", "BYTES", [2])
    typed.contents.bytes_contents.extend([b"a", b"\xff\x00"])
    items = np.array([b"x", b"yz", b""], dtype=object)
    decoded = decode_infer_request(_request(typed))
    assert decoded.inputs[0].data.tolist() == [b"a", b"\xff\x00"]
    raw = serialize_byte_tensor(items).item()
    decoded = decode_infer_request(_request(_tensor("s", "BYTES", [3]), raw=[raw]))
    assert decoded.inputs[0].data.tolist() == [b"x", b"yz", b""]


def test_a_request_without_inputs_decodes_for_a_model_that_has_none():
    assert decode_infer_request(_request()).inputs == []


def test_contents_and_raw_contents_do_not_mix():
    tensor = _tensor("INPUT0", "INT32", [1, 2])
    tensor.contents.int_contents.extend([1, 2])
    with pytest.raises(InvalidInput, match="contents field must not be specified when using raw_input_contents "
                                           "for 'INPUT0' for model 'm'"):
        decode_infer_request(_request(tensor, raw=[np.zeros(2, np.int32).tobytes()]))


@pytest.mark.parametrize("build,message", [
    (lambda: _request(_tensor("x", "FP32", [2])), "has no data"),
    (lambda: _request(_tensor("x", "FP32", [2]), raw=[b"\0" * 4]), r"needs 8 bytes, raw_input_contents\[0\] size is 4"),
    (lambda: _request(_tensor("x", "FP32", [-1]), raw=[b""]), "non-negative integers"),
    (lambda: _request(_tensor("x", "FP32", [2**31, 2**31]), raw=[b""]), "max_tensor_elements"),
    (lambda: _request(_tensor("x", "FLOAT", [1]), raw=[b"\0" * 4]), "unknown datatype 'FLOAT'"),
    (lambda: _request(_tensor("x", "BF16", [2]), raw=[b"\0" * 2]), r"needs 4 bytes, raw_input_contents\[0\] size is 2"),
    (lambda: _request(_tensor("x", "BF16", [1])), "has no data"),
    (lambda: _request(_tensor("", "FP32", [1]), raw=[b"\0" * 4]), "has no name"),
    (lambda: _request(_tensor("s", "BYTES", [2]), raw=[b"\1\0\0\0a\0\0\0"]),
     "holds 1 BYTES elements, the shape needs 2"),
])
def test_malformed_requests_say_what_is_wrong(build, message):
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(build())


def test_typed_contents_are_checked():
    short = _tensor("x", "INT32", [3])
    short.contents.int_contents.extend([1, 2])
    with pytest.raises(InvalidInput, match=r"needs 3 elements, contents.int_contents has 2"):
        decode_infer_request(_request(short))
    wide = _tensor("x", "INT8", [1])
    wide.contents.int_contents.append(300)
    with pytest.raises(InvalidInput, match="out of INT8's range"):
        decode_infer_request(_request(wide))
    half = _tensor("x", "FP16", [1])
    half.contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="FP16 has no typed contents field; send it in raw_input_contents"):
        decode_infer_request(_request(half))


def test_limits_and_reservations():
    tensors = [_tensor(f"x{i}", "FP32", [1]) for i in range(3)]
    with pytest.raises(InvalidInput, match="at most 2 are allowed"):
        decode_infer_request(_request(*tensors, raw=[b"\0" * 4] * 3), DecodeLimits(max_inputs=2))
    reserved: list[int] = []
    typed = _tensor("t", "FP64", [4])
    typed.contents.fp64_contents.extend([1.0] * 4)
    decode_infer_request(_request(typed), reserve=reserved.append)
    assert reserved == [32]  # what the typed values become as a numpy array
    reserved.clear()
    decode_infer_request(_request(_tensor("r", "FP32", [4]), raw=[b"\0" * 16]), reserve=reserved.append)
    assert reserved == [16]  # the copy of the raw bytes out of the message


def test_outputs_and_parameters():
    request = _request(_tensor("x", "FP32", [1]), raw=[b"\0" * 4])
    request.outputs.add(name="y").parameters["classification"].int64_param = 3
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 500
    request.parameters["flag"].bool_param = True
    request.parameters["label"].string_param = "a"
    request.parameters["ratio"].double_param = 0.5
    decoded = decode_infer_request(request)
    assert decoded.outputs[0].name == "y" and decoded.outputs[0].classification == 3
    assert decoded.parameters == {"priority": 2, "timeout": 500, "flag": True, "label": "a", "ratio": 0.5}
    bad = _request(_tensor("x", "FP32", [1]), raw=[b"\0" * 4])
    bad.outputs.add(name="y").parameters["classification"].string_param = "3"
    with pytest.raises(InvalidInput, match="invalid value for 'classification' parameter, expected >= 0"):
        decode_infer_request(bad)  # Triton's words (it refuses 0 as well)


def test_parameters_round_trip():
    message = pb.ModelInferResponse()
    values = {"b": True, "i": -3, "u": 2**63 + 1, "d": 1.5, "s": "text"}
    set_parameters(message.parameters, values)
    assert from_parameters(message.parameters) == values
    assert message.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"


def test_responses_carry_raw_output_contents():
    strings = np.array([[b"1:0.5"], [b"2:0.25"]], dtype=object)
    numbers = np.arange(6, dtype=np.float32).reshape(2, 3)
    response = InferResponse("m", 2, [InferOutput("n", "FP32", numbers), InferOutput("s", "BYTES", strings)],
                             id="r1", parameters={"sequence_end": True})
    message = encode_infer_response(response)
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "r1")
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [("n", "FP32", [2, 3]),
                                                                              ("s", "BYTES", [2, 1])]
    np.testing.assert_array_equal(np.frombuffer(message.raw_output_contents[0], np.float32).reshape(2, 3), numbers)
    assert deserialize_bytes_tensor(message.raw_output_contents[1]).tolist() == [b"1:0.5", b"2:0.25"]
    assert message.parameters["sequence_end"].bool_param is True


def test_a_head_built_once_serves_only_answers_it_describes():
    """The serialised heads of answers without parameters of their own are kept (a model's answers share a
    few): each answer still reads back as its own model, version, id, outputs and final flag."""
    def answer(model="m", version=1, request_id="", shape=(1, 4), name="y"):
        return InferResponse(model, version, [InferOutput(name, "FP32", np.zeros(shape, np.float32))], id=request_id)

    variants = [answer(), answer("n"), answer(version=2), answer(request_id="a"), answer(shape=(2, 4)),
                answer(name="z"), answer()]
    for response in variants:
        for final in (False, True, False):
            message = pb.ModelStreamInferResponse.FromString(serialize_stream_response(response, final))
            got = message.infer_response
            assert (got.model_name, got.model_version, got.id) == (response.model_name, str(response.model_version),
                                                                   response.id)
            assert [(o.name, list(o.shape)) for o in got.outputs] == [(o.name, list(o.data.shape))
                                                                      for o in response.outputs]
            assert dict(got.parameters) == {FINAL_RESPONSE: pb.InferParameter(bool_param=final)}
        plain = pb.ModelInferResponse.FromString(serialize_infer_response(response))
        assert not plain.parameters and plain == encode_infer_response(response)


def test_bf16_travels_as_raw_contents_both_ways():
    values = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    decoded = decode_infer_request(_request(_tensor("x", "BF16", [1, 3]), raw=[values.tobytes()]))
    assert decoded.inputs[0].datatype == "BF16" and decoded.inputs[0].data.dtype == ml_dtypes.bfloat16
    assert decoded.inputs[0].data.tolist() == values.tolist()
    message = encode_infer_response(InferResponse("m", 1, [InferOutput("y", "BF16", values)]))
    assert message.outputs[0].datatype == "BF16" and message.raw_output_contents[0] == values.tobytes()
    typed = _tensor("x", "BF16", [1])
    typed.contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="BF16 has no typed contents field; send it in raw_input_contents"):
        decode_infer_request(_request(typed))


def _shm(target, region: str, byte_size: int, offset: int = 0) -> None:
    target["shared_memory_region"].string_param = region
    target["shared_memory_byte_size"].int64_param = byte_size
    if offset:
        target["shared_memory_offset"].int64_param = offset


def test_shared_memory_tensors_are_described_not_read():
    in_region = _tensor("a", "INT32", [1, 16])
    _shm(in_region.parameters, "in", 64, offset=64)
    request = _request(in_region, _tensor("b", "INT32", [1, 16]), raw=[np.ones(16, np.int32).tobytes()])
    out = request.outputs.add(name="OUTPUT0")
    _shm(out.parameters, "out", 64)
    decoded = decode_infer_request(request, reserve=lambda size: None)
    assert [i.name for i in decoded.inputs] == ["b"]  # the region's input takes no raw_input_contents entry
    (shared,) = decoded.shared_inputs
    assert (shared.name, shared.datatype, shared.shape) == ("a", "INT32", (1, 16))
    assert (shared.source.region, shared.source.byte_size, shared.source.offset) == ("in", 64, 64)
    assert decoded.outputs[0].shared_memory.region == "out" and decoded.uses_shared_memory


@pytest.mark.parametrize("build,message", [
    (lambda t: (_shm(t.parameters, "in", 64), t.contents.int_contents.extend([0] * 16)),
     "names a shared memory region and also carries contents"),
    (lambda t: t.parameters["shared_memory_byte_size"].__setattr__("int64_param", 64),
     "shared_memory_byte_size given without shared_memory_region"),
    (lambda t: t.parameters["shared_memory_region"].__setattr__("string_param", "in"),
     "needs shared_memory_byte_size"),
    (lambda t: _shm(t.parameters, "in", -1), "shared_memory_byte_size must be a non-negative integer"),
])
def test_malformed_shared_memory_parameters(build, message):
    tensor = _tensor("a", "INT32", [1, 16])
    build(tensor)
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(_request(tensor))


def test_outputs_in_shared_memory_come_back_without_data_or_parameters():
    from appliance.engine.types import SharedMemoryRef

    response = InferResponse("m", 1, [
        InferOutput("in_region", "INT32", np.zeros((1, 16), np.int32), SharedMemoryRef("out", 64, 8)),
        InferOutput("inline", "INT32", np.arange(4, dtype=np.int32)),
    ])
    message = encode_infer_response(response)
    assert list(message.raw_output_contents) == [b"", np.arange(4, dtype=np.int32).tobytes()]  # positions kept
    assert not message.outputs[0].parameters  # as Triton 2.51 answers (tests/oracle)
    assert list(message.outputs[0].shape) == [1, 16] and not message.outputs[1].parameters


def test_an_output_named_twice_reaches_validation_as_twice():
    request = _request(_tensor("x", "FP32", [1]), raw=[b"\0" * 4])
    request.outputs.add(name="y")
    request.outputs.add(name="y")
    assert [o.name for o in decode_infer_request(request).outputs] == ["y", "y"]  # refused by validate_request


def test_raw_contents_beyond_the_inputs_are_left_unread():
    """As Triton 2.51 answers (tests/oracle): the extra chunk is not an error."""
    decoded = decode_infer_request(_request(_tensor("x", "FP32", [1]), raw=[b"\0" * 4, b"\0" * 4]))
    assert [i.name for i in decoded.inputs] == ["x"]
