"""KnownHeader: a binary request whose JSON header a connection sent before is decoded from a plan exactly
as the full decode decodes it (same request, same refusal, same bytes counted); and the binary answer whose
header is written once for its shapes is the general encoder's answer, byte for byte (hostile cases and
hypothesis properties against ``decode_infer_request`` and the general encoder)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import appliance.rest.binary_header as binary_header
import appliance.rest.codec as codec
from appliance.core.errors import ApplianceError
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferOutput, InferRequest, InferResponse, RequestedOutput
from appliance.rest.binary_header import MAX_KNOWN_HEADER, KnownHeader
from appliance.rest.codec import decode_infer_request, encode_in_pieces

LIMITS = DecodeLimits()


def _body(values: np.ndarray, *, datatype: str = "FP32", extra: dict | None = None, outputs: list | None = None,
          request: dict | None = None, size: int | None = None) -> tuple[bytes, int]:
    raw = values.tobytes()
    header = orjson.dumps({
        **(request or {}),
        "inputs": [{"name": "INPUT0", "shape": list(values.shape), "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw) if size is None else size}, **(extra or {})}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}] if outputs is None else outputs,
    })
    return header + raw, len(header)


def _outcome(decode, body: bytes, header_length: int, limits: DecodeLimits = LIMITS):
    """What a decode makes of a body: the request's fields and the bytes it counted, or the refusal."""
    counted: list[int] = []
    try:
        request = decode(body, header_length, limits, counted.append)
    except ApplianceError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "request_id", None)
    return _fields(request), [size for size in counted if size]  # (reserving nothing is no reservation)


def _fields(request: InferRequest) -> tuple:
    return ([(i.name, i.datatype, i.data.dtype.str, i.data.shape,
              i.data.tolist() if i.data.dtype == object else i.data.tobytes()) for i in request.inputs],
            [(o.name, o.parameters, o.shared_memory) for o in request.outputs], request.id, request.parameters,
            request.shared_inputs)


@pytest.fixture
def full_decodes(monkeypatch):
    """How many requests went through the full decode."""
    calls = []

    def counting(*args):
        calls.append(args)
        return decode_infer_request(*args)
    monkeypatch.setattr(binary_header, "decode_infer_request", counting)
    return calls


def test_a_header_sent_a_third_time_is_decoded_from_its_plan_with_the_new_tensor_bytes(full_decodes):
    known = KnownHeader()
    for step in range(6):
        values = np.arange(16, dtype=np.float32).reshape(1, 16) * step
        body, size = _body(values, request={"id": "r1", "parameters": {"sequence_id": 7}})
        assert _outcome(known.decode, body, size) == _outcome(decode_infer_request, body, size)
        request = known.decode(body, size, LIMITS, lambda n: None)
        np.testing.assert_array_equal(request.inputs[0].data, values)
    assert len(full_decodes) == 2  # the first sight, the second (which makes the plan); none after


def test_each_planned_request_has_dicts_of_its_own():
    known = KnownHeader()
    body, size = _body(np.zeros((1, 4), np.float32), request={"parameters": {"a": 1}})
    for _ in range(3):
        first = known.decode(body, size, LIMITS, lambda n: None)
    first.parameters["added"] = True
    first.outputs[0].parameters["added"] = True
    second = known.decode(body, size, LIMITS, lambda n: None)
    assert second.parameters == {"a": 1} and second.outputs[0].parameters == {"binary_data": True}


def _hostile() -> dict[str, tuple[bytes, int]]:
    body, size = _body(np.arange(4, dtype=np.int32).reshape(1, 4), datatype="INT32")
    texts = np.array([[b"ab", b"c"]], dtype=object)
    items = b"".join(len(t).to_bytes(4, "little") + t for t in texts.ravel())
    header = orjson.dumps({"id": "text", "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                                     "parameters": {"binary_data_size": len(items)}}]})
    return {
        "trailing bytes": (body + b"\0\0\0\0", size),
        "a body cut short": (body[:-4], size),
        "a header length inside the header": (body, size - 1),
        "a header length past the body": (body, len(body) + 1),
        "another header of the same length": (body.replace(b"INT32", b"INT16"), size),
        "BYTES items that do not fill their bytes": (header + items.replace(b"\x02\x00\x00\x00", b"\x09\x00\x00\x00",
                                                                            1), len(header)),
    }


@pytest.mark.parametrize("case", list(_hostile()))
def test_a_body_that_departs_from_the_plan_gets_what_the_full_decode_gives_it(case):
    good, size = _body(np.arange(4, dtype=np.int32).reshape(1, 4), datatype="INT32")
    body, header_length = _hostile()[case]
    known = KnownHeader()
    if case.startswith("BYTES"):  # its header, planned on a good body first
        header = body[:header_length]
        items = b"".join(len(t).to_bytes(4, "little") + t for t in (b"ab", b"c"))
        for _ in range(3):
            known.decode(header + items, header_length, LIMITS, lambda n: None)
    else:
        for _ in range(3):
            known.decode(good, size, LIMITS, lambda n: None)
    assert _outcome(known.decode, body, header_length) == _outcome(decode_infer_request, body, header_length)
    assert _outcome(known.decode, good, size) == _outcome(decode_infer_request, good, size)  # the plan still holds


def test_headers_without_a_plan_are_decoded_in_full_every_time(full_decodes):
    values = np.ones((1, 2), np.float32)
    json_data = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 1]}],
                              "outputs": [{"name": "OUTPUT0"}]})
    shared = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 8}}]})
    long, long_size = _body(values, request={"id": "x" * MAX_KNOWN_HEADER})
    for body, size in ((json_data + b"", len(json_data)), (shared, len(shared)), (long, long_size)):
        full_decodes.clear()
        known = KnownHeader()
        for _ in range(4):
            assert _outcome(known.decode, body, size) == _outcome(decode_infer_request, body, size)
        assert len(full_decodes) == 4


def test_other_limits_are_not_taken_from_a_plan_made_under_these(full_decodes):
    known = KnownHeader()
    body, size = _body(np.zeros((1, 16), np.float32))
    for _ in range(3):
        known.decode(body, size, LIMITS, lambda n: None)
    tight = DecodeLimits(max_tensor_elements=8)
    assert _outcome(known.decode, body, size, tight) == _outcome(decode_infer_request, body, size, tight)
    assert _outcome(known.decode, body, size, tight)[0] == "InvalidInput"


def test_a_planned_bytes_tensor_is_counted_and_refused_as_in_full():
    texts = [b"ab", b"c"]
    items = b"".join(len(t).to_bytes(4, "little") + t for t in texts)
    header = orjson.dumps({"id": "q", "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                                  "parameters": {"binary_data_size": len(items)}}]})
    known = KnownHeader()
    for _ in range(3):
        assert _outcome(known.decode, header + items, len(header)) == _outcome(decode_infer_request, header + items,
                                                                               len(header))
    bad = header + (5).to_bytes(4, "little") + items[4:]  # the same length; the first item claims too much
    refused = _outcome(known.decode, bad, len(header))
    assert refused == _outcome(decode_infer_request, bad, len(header))
    assert refused[0] == "InputMismatch" and refused[2] == "q"


_DATATYPES = {"FP32": np.float32, "INT8": np.int8, "UINT16": np.uint16, "INT64": np.int64, "BOOL": np.bool_,
              "FP16": np.float16}


@st.composite
def _bodies(draw):
    """A few bodies a client might send on one connection: headers that repeat, with other bytes; and now and
    then one whose lengths or header bytes were tampered with."""
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    datatype = draw(st.sampled_from(sorted(_DATATYPES)))
    bodies = []
    for _ in range(draw(st.integers(1, 6))):
        values = np.frombuffer(draw(st.binary(min_size=int(np.prod(shape)) * np.dtype(_DATATYPES[datatype]).itemsize,
                                              max_size=int(np.prod(shape)) * np.dtype(_DATATYPES[datatype]).itemsize)),
                               dtype=np.uint8).view(_DATATYPES[datatype]).reshape(shape) if np.prod(shape) else \
            np.zeros(shape, _DATATYPES[datatype])
        body, size = _body(values, datatype=datatype, size=draw(st.sampled_from([None, None, None, 0, 3, 1 << 20])))
        tamper = draw(st.sampled_from(["none", "none", "none", "cut", "extend", "length", "flip"]))
        if tamper == "cut":
            body = body[:-1]
        elif tamper == "extend":
            body += b"\x01"
        elif tamper == "length":
            size = draw(st.integers(-1, len(body) + 1))
        elif tamper == "flip" and body:
            at = draw(st.integers(0, len(body) - 1))
            body = body[:at] + bytes([body[at] ^ 0x20]) + body[at + 1:]
        bodies.append((body, size))
    return bodies


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies(), st.integers(1, 3))
def test_whatever_a_connection_sends_the_plan_decodes_it_as_the_full_decode(bodies, rounds):
    known = KnownHeader()
    for _ in range(rounds):
        for body, size in bodies:
            if size < 0:
                continue  # (the transport refuses a negative Inference-Header-Content-Length first)
            assert _outcome(known.decode, body, size) == _outcome(decode_infer_request, body, size)


# -- the answer's header, written once for its shapes ------------------------------------------------


def _request_binary(*names: str) -> InferRequest:
    return InferRequest([], [RequestedOutput(name, {"binary_data": True}) for name in names])


def test_a_binary_answer_is_the_general_encoders_and_its_header_is_kept():
    codec._BINARY_HEADERS.clear()
    response = InferResponse("m", 1, [InferOutput("OUTPUT0", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3))])
    request = _request_binary("OUTPUT0")
    general = codec._in_pieces(response, codec._binary_choice(request))
    assert encode_in_pieces(response, request) == general
    assert len(codec._BINARY_HEADERS) == 1
    other = InferResponse("m", 1, [InferOutput("OUTPUT0", "FP32", np.ones((2, 3), np.float32))])
    assert encode_in_pieces(other, request) == codec._in_pieces(other, codec._binary_choice(request))
    assert len(codec._BINARY_HEADERS) == 1  # the same shapes: the same header


@pytest.mark.parametrize("case", ["an empty output", "a JSON output beside", "a long id", "parameters", "BYTES",
                                  "shared memory"])
def test_answers_the_kept_headers_do_not_cover_are_written_in_full(case):
    codec._BINARY_HEADERS.clear()
    outputs = [InferOutput("OUTPUT0", "FP32", np.ones((1, 2), np.float32))]
    request = _request_binary("OUTPUT0")
    fields: dict = {}
    if case == "an empty output":
        outputs = [InferOutput("OUTPUT0", "FP32", np.ones((1, 0), np.float32))]
    elif case == "a JSON output beside":
        outputs.append(InferOutput("OUTPUT1", "INT32", np.ones((1, 2), np.int32)))
    elif case == "a long id":
        fields["id"] = "a" * (codec._KEPT_ID + 1)
    elif case == "parameters":
        fields["parameters"] = {"p": 1}
    elif case == "BYTES":
        outputs = [InferOutput("OUTPUT0", "BYTES", np.array([[b"a", b"bc"]], dtype=object))]
    else:
        from appliance.protocol.shared_memory.params import SharedMemoryRef
        outputs = [InferOutput("OUTPUT0", "FP32", np.ones((1, 2), np.float32), SharedMemoryRef("r", 0, 8))]
    response = InferResponse("m", 1, outputs, **fields)
    assert encode_in_pieces(response, request) == codec._in_pieces(response, codec._binary_choice(request))
    assert not codec._BINARY_HEADERS


def test_the_kept_headers_are_bounded_in_number_and_in_length():
    codec._BINARY_HEADERS.clear()
    request = _request_binary("OUTPUT0")
    for rows in range(codec._MAX_BINARY_HEADERS + 10):
        response = InferResponse("m", 1, [InferOutput("OUTPUT0", "INT8", np.zeros((rows + 1,), np.int8))])
        assert encode_in_pieces(response, request) == codec._in_pieces(response, codec._binary_choice(request))
    assert len(codec._BINARY_HEADERS) <= codec._MAX_BINARY_HEADERS
    codec._BINARY_HEADERS.clear()
    names = [f"OUTPUT{index}" for index in range(200)]  # a header of about 20 KiB
    many = InferResponse("m", 1, [InferOutput(name, "INT8", np.zeros((1,), np.int8)) for name in names])
    wanted = _request_binary(*names)
    assert encode_in_pieces(many, wanted) == codec._in_pieces(many, codec._binary_choice(wanted))
    assert not codec._BINARY_HEADERS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_DATATYPES)), st.lists(st.integers(0, 3), max_size=3),
                          st.booleans()), min_size=1, max_size=3), st.integers(0, 3),
       st.one_of(st.none(), st.text(max_size=70)))
def test_whatever_the_outputs_the_answer_is_the_general_encoders(specs, version, request_id):
    outputs = [InferOutput(f"OUT{index}", datatype, np.ones(shape, _DATATYPES[datatype]))
               for index, (datatype, shape, _) in enumerate(specs)]
    request = InferRequest([], [RequestedOutput(f"OUT{index}", {"binary_data": binary})
                                for index, (_, _, binary) in enumerate(specs)])
    response = InferResponse("m", version, outputs, request_id)
    for _ in range(2):  # the second time from the kept header, where one was kept
        assert encode_in_pieces(response, request) == codec._in_pieces(response, codec._binary_choice(request))


def test_the_lanes_binary_answer_is_the_general_encoders_up_to_the_event_loops_bound():
    request = _request_binary("OUTPUT0")
    small = InferResponse("m", 1, [InferOutput("OUTPUT0", "FP32", np.ones((1, 16), np.float32))], "")
    assert codec.binary_answer(small, request) == encode_in_pieces(small, request)
    elements = codec.DECODE_OFF_LOOP_BYTES // 4 + 1
    large = InferResponse("m", 1, [InferOutput("OUTPUT0", "FP32", np.ones((elements,), np.float32))])
    assert codec.binary_answer(large, request) is None  # an encoding worker's
    assert codec.binary_answer(small, InferRequest([])) is None  # nothing asked as binary: plain_answer's
