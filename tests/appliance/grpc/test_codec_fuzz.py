"""Property-based fuzzing of what the gRPC port parses: the 5-byte length-prefixed message framing of a
call (``appliance.grpc.http2.call``: compressed flag, length, gzip/deflate), the ModelInferRequest
message (``appliance.grpc.admission.parse``) and its decoding into a core request (``appliance.grpc.codec``:
raw_input_contents against shapes and datatypes, typed contents), and the response encoder.

Messages are built valid (tritonclient's own request builder), then mutated: fields changed, raw
contents truncated or swapped, serialized bytes flipped, frames cut anywhere. Whatever arrives, the
server answers with messages or a request, or with an ``ApplianceError`` a client is blamed for (4xx);
it allocates no more than a small multiple of the bytes it received, and a call whose client has
ended never waits. Each test runs a fixed, derandomized set of examples (reproducible, bounded in CI).
"""

from __future__ import annotations

import asyncio
import gzip
import zlib

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from appliance.core.errors import InvalidInput, PayloadTooLarge
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferOutput, InferRequest, InferResponse, SharedMemoryRef
from appliance.grpc.admission import inflated, parse
from appliance.grpc.codec import (
    CONTENTS_FIELD,
    FINAL_RESPONSE,
    decode_infer_request,
    encode_infer_response,
    serialize_infer_response,
    serialize_stream_response,
    stream_options,
)
from appliance.grpc.http2.call import Call
from appliance.grpc.http2.headers import Request
from appliance.protocol.inflate import InflateLimits
from appliance.security.budget import MemoryBudget
from tests.appliance.grpc.memory_channel import MemoryChannel
from tests.appliance.strategies_fuzz import (
    DATATYPES,
    FEW,
    FUZZ,
    HUGE_COUNTS,
    Reservations,
    assert_client_error,
    assert_same_array,
    measure_peak,
    mutated,
    tensors,
)
from tests.waiting import next_turn

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of stalling CI

_PER_BYTE = 64
_FIXED = 256 * 1024
_INT64 = (-(2**63), 2**63 - 1)


class _Account:
    """What ``parse`` needs of the request's memory account."""

    def __init__(self) -> None:
        self.reserved = Reservations()

    def reserve(self, size: int) -> None:
        self.reserved(size)


# ModelInferRequest --------------------------------------------------------------------------------------


@st.composite
def _client_tensors(draw: st.DrawFn, max_inputs: int = 4) -> list[tuple[str, np.ndarray]]:
    arrays = draw(st.lists(tensors(DATATYPES), max_size=max_inputs))
    return [(f"in{i}", array) for i, (_, array) in enumerate(arrays)]


def _datatype(array: np.ndarray) -> str:
    return "BYTES" if array.dtype == object else grpcclient.np_to_triton_dtype(array.dtype)


def _client_message(named: list[tuple[str, np.ndarray]], request_id: str = "",
                    parameters: dict | None = None) -> pb.ModelInferRequest:
    """The ModelInferRequest tritonclient sends (every tensor in raw_input_contents)."""
    inputs = []
    for name, array in named:
        tensor = grpcclient.InferInput(name, list(array.shape), _datatype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return _get_inference_request(model_name="m", inputs=inputs, model_version="", request_id=request_id,
                                  outputs=None, sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
                                  timeout=None, parameters=parameters)


def _decode_or_refuse(message: pb.ModelInferRequest, size: int,
                      limits: DecodeLimits = DecodeLimits()) -> tuple[InferRequest | None, Reservations, int]:
    """Decode as the service does (then its reserved-parameter check), under tracemalloc: the request or
    None when refused (with a 4xx ApplianceError), the reservations made and the peak allocation."""
    reserved = Reservations()
    request = None
    with measure_peak() as peak:
        try:
            request = decode_infer_request(message, limits, reserved)
            stream_options(request.parameters)
        except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
            assert_client_error(exc)
            request = None
    assert peak[0] <= _PER_BYTE * size + _FIXED, f"{peak[0]} bytes allocated for a {size}-byte message"
    assert reserved.total <= _PER_BYTE * size + _FIXED
    if request is not None:
        for tensor in request.inputs:
            assert tensor.data.size <= max(size, 1)  # every element came in the message
            if tensor.datatype == "BYTES":
                assert all(type(item) is bytes for item in tensor.data.ravel())
    return request, reserved, peak[0]


@FUZZ
@given(named=_client_tensors(), request_id=st.text(max_size=8))
def test_tritonclient_messages_decode_to_the_same_tensors(named, request_id):
    wire = _client_message(named, request_id, {"custom": 3}).SerializeToString()
    request = decode_infer_request(parse(wire, "ModelInfer", pb.ModelInferRequest.FromString, _Account()))
    assert [t.name for t in request.inputs] == [name for name, _ in named]
    for tensor, (_, array) in zip(request.inputs, named, strict=True):
        assert tensor.datatype == _datatype(array)
        assert_same_array(tensor.data, array)
    assert request.id == (request_id or None)
    assert request.parameters == {"custom": 3}


@FEW
@given(datatype_array=tensors(tuple(CONTENTS_FIELD)))
def test_typed_contents_decode_to_the_same_tensor(datatype_array):
    datatype, array = datatype_array
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    request = decode_infer_request(pb.ModelInferRequest(model_name="m", inputs=[tensor]))
    assert_same_array(request.inputs[0].data, array)


_CLAIMS = [c for c in (0, *HUGE_COUNTS) if c < 2**63]  # a protobuf shape is int64
_SHAPES = (st.lists(st.integers(-2, 5), max_size=4) | st.lists(st.sampled_from(_CLAIMS), min_size=1, max_size=4)
           | st.lists(st.integers(*_INT64), max_size=65))
_DATATYPE_VALUES = st.sampled_from([*DATATYPES, "", "fp32", "STRING", "TYPE_FP32"]) | st.text(max_size=6)
_CONTENT_VALUES = {
    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(*_INT64), "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(), "bytes_contents": st.binary(max_size=6),
}
_PARAMETER_VALUES = st.one_of(
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(*_INT64)),
    st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats()),
    st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=6)),
    st.just(pb.InferParameter()),
)

_PARAMETER_KEYS = st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
                                   "classification", "binary_data", "triton_enable_empty_final_response",
                                   "triton_x", "priority"]) | st.text(max_size=6)


def _set_parameters(target, draw: st.DrawFn) -> None:  # noqa: ANN001 - a protobuf map
    for key, value in draw(st.dictionaries(_PARAMETER_KEYS, _PARAMETER_VALUES, max_size=3)).items():
        target[key].CopyFrom(value)


@st.composite
def _mutated_message(draw: st.DrawFn, message: pb.ModelInferRequest) -> pb.ModelInferRequest:
    """``message`` with one to three of its fields changed: an input's shape, datatype, contents or
    parameters, its raw_input_contents, the requested outputs or the request's parameters."""
    message = pb.ModelInferRequest.FromString(message.SerializeToString())
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(("shape", "datatype", "contents", "parameters", "name", "raw", "drop_raw",
                                      "add_raw", "drop_input", "outputs", "request_parameters")))
        raw = message.raw_input_contents
        if field == "raw" and raw:
            index = draw(st.integers(0, len(raw) - 1))
            raw[index] = draw(mutated(raw[index]))
        elif field == "drop_raw" and raw:
            del raw[draw(st.integers(0, len(raw) - 1))]
        elif field == "add_raw":
            raw.append(draw(st.binary(max_size=16)))
        elif field == "outputs":
            for name in draw(st.lists(st.text(max_size=4), max_size=3)):
                _set_parameters(message.outputs.add(name=name).parameters, draw)
        elif field == "request_parameters":
            _set_parameters(message.parameters, draw)
        elif message.inputs:
            index = draw(st.integers(0, len(message.inputs) - 1))
            tensor = message.inputs[index]
            if field == "shape":
                del tensor.shape[:]
                tensor.shape.extend(draw(_SHAPES))
            elif field == "datatype":
                tensor.datatype = draw(_DATATYPE_VALUES)
            elif field == "contents":
                name = draw(st.sampled_from(sorted(_CONTENT_VALUES)))
                getattr(tensor.contents, name).extend(draw(st.lists(_CONTENT_VALUES[name], max_size=8)))
            elif field == "parameters":
                _set_parameters(tensor.parameters, draw)
            elif field == "name":
                tensor.name = draw(st.text(max_size=4))
            elif field == "drop_input":
                del message.inputs[index]
    return message


@FUZZ
@given(named=_client_tensors(max_inputs=3), data=st.data())
def test_messages_with_changed_fields_are_decoded_or_refused(named, data):
    message = data.draw(_mutated_message(_client_message(named)))
    _decode_or_refuse(message, message.ByteSize())


@FUZZ
@given(named=_client_tensors(max_inputs=3), data=st.data())
def test_mutated_wire_messages_are_parsed_and_decoded_or_refused(named, data):
    wire = data.draw(mutated(_client_message(named).SerializeToString()))
    account = _Account()
    try:
        message = parse(wire, "ModelInfer", pb.ModelInferRequest.FromString, account)
    except Exception as exc:  # noqa: BLE001
        assert_client_error(exc)
        return
    assert account.reserved.total == len(wire)
    _decode_or_refuse(message, len(wire))


@FEW
@given(wire=st.binary(max_size=256))
def test_random_bytes_are_refused_or_decoded(wire):
    try:
        message = parse(wire, "ModelInfer", pb.ModelInferRequest.FromString, _Account())
    except Exception as exc:  # noqa: BLE001
        assert_client_error(exc)
        return
    _decode_or_refuse(message, len(wire))


@FUZZ
@given(datatype=st.sampled_from(DATATYPES), count=st.sampled_from(_CLAIMS[1:]),
       dims=st.integers(1, 3), payload=st.binary(max_size=64), typed=st.booleans(),
       limit=st.sampled_from([2**30, 2**40]))
def test_a_shape_claiming_more_than_the_message_holds_is_refused_before_allocation(datatype, count, dims, payload,
                                                                                    typed, limit):
    """A shape of 2**30 (or up to 2**63) elements with a few bytes of raw or typed contents: refused
    (400) with no buffer sized from the claim."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[count] + [1] * (dims - 1))
    message = pb.ModelInferRequest(model_name="m", inputs=[tensor])
    field = CONTENTS_FIELD.get(datatype)
    if typed and field is not None:
        values = {"bool_contents": [bool(b & 1) for b in payload], "bytes_contents": [payload]}
        getattr(tensor.contents, field).extend(values.get(field, list(payload)))
    else:
        message.raw_input_contents.append(payload)
    request, reserved, peak = _decode_or_refuse(message, message.ByteSize(), DecodeLimits(limit))
    assert request is None, "a tensor of more elements than the message has bytes was accepted"
    assert peak < _FIXED and reserved.total <= _PER_BYTE * message.ByteSize() + 64


@pytest.mark.parametrize(("datatype", "shape"), [("FP64", [0, 2**30, 2**30]), ("BYTES", [2**30, 2**30, 0]),
                                                 ("BOOL", [0, 2**30, 2**30, 2**30])])
def test_an_empty_tensor_of_a_shape_numpy_cannot_make_is_invalid_argument(datatype, shape):
    """Found by fuzzing: no elements, yet numpy refused the shape with ValueError (INTERNAL)."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=shape)
    with pytest.raises(InvalidInput, match="max_tensor_elements"):
        decode_infer_request(pb.ModelInferRequest(model_name="m", inputs=[tensor]))


# Responses -----------------------------------------------------------------------------------------------


@FEW
@given(arrays=st.lists(tensors(DATATYPES), max_size=4), response_id=st.none() | st.text(max_size=4))
def test_responses_read_back_by_tritonclient_give_the_same_outputs(arrays, response_id):
    outputs = [InferOutput(f"out{i}", datatype, array) for i, (datatype, array) in enumerate(arrays)]
    message = encode_infer_response(InferResponse("m", 1, outputs, id=response_id))
    result = grpcclient.InferResult(pb.ModelInferResponse.FromString(message.SerializeToString()))
    for output in outputs:
        got = result.as_numpy(output.name)
        assert got is not None and got.shape == output.data.shape
        if output.datatype == "BYTES":
            assert [bytes(x) for x in got.ravel()] == list(output.data.ravel())
        else:
            assert_same_array(got, output.data)


@FUZZ
@given(arrays=st.lists(tensors(DATATYPES), max_size=4), shared=st.lists(st.booleans(), min_size=4, max_size=4),
       response_id=st.none() | st.text(max_size=4),
       parameters=st.sampled_from([{}, {"sequence_end": True, "n": 3, "s": "x", "f": 0.5, "big": 2**63}]))
def test_serialized_responses_are_the_messages_bytes(arrays, shared, response_id, parameters):
    """ModelInfer's answer, written without a message holding the tensors, is byte for byte what
    protobuf serialises of the message (shared-memory outputs keep an empty raw_output_contents entry)."""
    outputs = [InferOutput(f"out{i}", datatype, array, SharedMemoryRef("r", array.nbytes) if shared[i] else None)
               for i, (datatype, array) in enumerate(arrays)]
    response = InferResponse("m", 7, outputs, id=response_id, parameters=parameters)
    assert serialize_infer_response(response) == encode_infer_response(response).SerializeToString()


@FUZZ
@given(arrays=st.lists(tensors(DATATYPES), max_size=4), shared=st.lists(st.booleans(), min_size=4, max_size=4),
       response_id=st.none() | st.text(max_size=4), final=st.booleans(),
       parameters=st.sampled_from([{}, {"sequence_end": True, "n": 3, "s": "x", "f": 0.5, "big": 2**63},
                                   {f"p{i}": i for i in range(20)}]))
def test_serialized_stream_responses_are_the_messages_bytes(arrays, shared, response_id, final, parameters):
    """A ModelStreamInfer response, written without a message holding the tensors, is byte for byte what
    protobuf serialises of the message built as the stream built it (the answer in its stream message,
    then the final flag), parameters in the same order."""
    outputs = [InferOutput(f"out{i}", datatype, array, SharedMemoryRef("r", array.nbytes) if shared[i] else None)
               for i, (datatype, array) in enumerate(arrays)]
    response = InferResponse("m", 7, outputs, id=response_id, parameters=parameters)
    message = pb.ModelStreamInferResponse(infer_response=encode_infer_response(response))
    message.infer_response.parameters[FINAL_RESPONSE].bool_param = final
    assert serialize_stream_response(response, final) == message.SerializeToString()


def test_a_large_stream_response_is_the_messages_bytes():
    """Past 1 MiB (a tensor copied out in pieces) and with a length of several varint bytes."""
    response = InferResponse("m", 1, [InferOutput("y", "FP32", np.arange(3 << 20, dtype=np.float32)[::3]),
                                      InferOutput("t", "BYTES", np.array([b"a" * 300] * 5000, dtype=object))])
    message = pb.ModelStreamInferResponse(infer_response=encode_infer_response(response))
    message.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    assert serialize_stream_response(response, True) == message.SerializeToString()
    assert serialize_infer_response(response) == encode_infer_response(response).SerializeToString()


# Message framing on a call ---------------------------------------------------------------------------------


def _call(max_message: int, encoding: bytes) -> Call:
    request = Request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/"
                       b"ModelInfer"), (b"content-type", b"application/grpc"), (b"grpc-encoding", encoding)])
    connection = MemoryChannel(max_message, max_frame=1 << 20)
    return Call(connection, 1, request, receive_window=1 << 40, send_window=1 << 20)  # type: ignore[arg-type]


def _framed(flag: int, payload: bytes) -> bytes:
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


_COMPRESS = {b"gzip": gzip.compress, b"deflate": zlib.compress, b"identity": None}


async def _read_all(call: Call, frames: list[bytes], interleaved: bool, max_message: int = 1 << 20) -> list[bytes]:
    """Feed ``frames`` (the last one ends the stream) and read every message as the handler does (a
    compressed one inflated on the request's account, ``admission.inflated``); the handler either waits
    while they come (``interleaved``) or reads once they all came. The call's failure raises."""
    async def collect() -> list[bytes]:
        messages = []
        with MemoryBudget(1 << 30).account() as account:
            while (message := await asyncio.wait_for(call.read(), 5)) is not grpc.aio.EOF:
                messages.append(await inflated(message, account, InflateLimits(max_message)))
        return messages

    reader = asyncio.ensure_future(collect()) if interleaved else None
    for index, payload in enumerate(frames):
        if interleaved:
            await next_turn()
        call.data(payload, len(payload), end=index == len(frames) - 1)
    if not frames:
        call.remote_end()
    return await (reader if reader is not None else collect())


def _cut(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    return [wire[a:b] for a, b in zip(points, points[1:], strict=False)] or [b""]


@FUZZ
@given(messages=st.lists(st.binary(max_size=300), max_size=5), encoding=st.sampled_from(sorted(_COMPRESS)),
       data=st.data())
def test_messages_cut_into_any_frames_arrive_whole(messages, encoding, data):
    compress = _COMPRESS[encoding]
    flags = [data.draw(st.booleans()) if compress else False for _ in messages]
    wire = b"".join(_framed(1, compress(m)) if flag and compress else _framed(0, m)
                    for m, flag in zip(messages, flags, strict=True))
    frames = _cut(wire, data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))

    async def run() -> list[bytes]:
        return await _read_all(_call(1 << 20, encoding), frames, data.draw(st.booleans()))

    assert asyncio.run(run()) == messages


@FUZZ
@given(messages=st.lists(st.binary(max_size=64), min_size=1, max_size=3), encoding=st.sampled_from(sorted(_COMPRESS)),
       max_message=st.sampled_from([16, 100, 1 << 20]), data=st.data())
def test_mutated_framing_gives_messages_or_a_client_error_and_never_waits(messages, encoding, max_message, data):
    """Flags, lengths and bytes changed anywhere (the flag byte to any value, with or without a
    grpc-encoding): the handler reads messages or the call's error (InvalidInput, PayloadTooLarge), and
    once the client ended the stream a read never waits."""
    compress = _COMPRESS[encoding]
    wire = b"".join(_framed(1, compress(m)) if compress and data.draw(st.booleans()) else _framed(0, m)
                    for m in messages)
    wire = data.draw(mutated(wire))
    frames = _cut(wire, data.draw(st.lists(st.integers(0, len(wire)), max_size=4)))

    async def run() -> None:
        interleaved = data.draw(st.booleans())
        with measure_peak() as peak:
            try:
                got = await _read_all(_call(max_message, encoding), frames, interleaved, max_message)
            except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
                assert_client_error(exc)
            else:
                assert all(len(m) <= max_message for m in got)
        assert peak[0] <= _PER_BYTE * len(wire) + 2 * max_message + _FIXED

    asyncio.run(run())


@FEW
@given(claim=st.integers(1 << 16, 2**32 - 1), received=st.binary(max_size=64), max_message=st.sampled_from([1 << 20,
                                                                                                           2**32]))
def test_a_length_prefix_claiming_more_than_received_allocates_nothing_for_the_claim(claim, received, max_message):
    """A prefix claiming up to 4 GiB: refused from the prefix above max_message_bytes; below it, only
    what came is held, and a stream that ends inside the message is refused."""
    async def run() -> None:
        call = _call(max_message, b"identity")
        with measure_peak() as peak:
            call.data(b"\x00" + claim.to_bytes(4, "big") + received, 5 + len(received), end=False)
        assert peak[0] < _FIXED
        call.remote_end()
        expected = PayloadTooLarge if claim > max_message else InvalidInput
        with pytest.raises(expected):
            await asyncio.wait_for(call.read(), 5)

    asyncio.run(run())


@FEW
@given(size=st.integers(1 << 20, 8 << 20), encoding=st.sampled_from([b"gzip", b"deflate"]),
       max_message=st.sampled_from([1 << 10, 1 << 16, 1 << 19]))
def test_a_decompression_bomb_is_refused_within_the_message_limit(size, encoding, max_message):
    """Megabytes of zeros compressed to a few kilobytes: refused (413) once inflating passes
    max_message_bytes, having allocated no more than about that limit."""
    bomb = _COMPRESS[encoding](bytes(size))  # type: ignore[misc]

    async def run() -> None:
        call = _call(max_message, encoding)
        with measure_peak() as peak, pytest.raises(PayloadTooLarge):
            await _read_all(call, [_framed(1, bomb)], interleaved=False, max_message=max_message)
        assert peak[0] <= 4 * max_message + 4 * len(bomb) + _FIXED

    asyncio.run(run())


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
@pytest.mark.parametrize("damage", ["checksum cut", "halved", "trailing bytes"])
def test_a_compressed_message_that_is_cut_or_followed_by_bytes_is_refused(encoding, damage):
    """Found by fuzzing the framing: a well-framed message whose compressed content is cut short (its
    checksum unchecked) or followed by other bytes was read as its prefix (zlib raises on neither)."""
    message = _client_message([("x", np.arange(64, dtype=np.int32))]).SerializeToString()
    compressed = _COMPRESS[encoding](message)  # type: ignore[misc]
    compressed = {"checksum cut": compressed[:-2], "halved": compressed[: len(compressed) // 2],
                  "trailing bytes": compressed + b"\x00junk"}[damage]

    async def run() -> None:
        with pytest.raises(InvalidInput):
            await _read_all(_call(1 << 20, encoding), [_framed(1, compressed)], interleaved=False)

    asyncio.run(run())
