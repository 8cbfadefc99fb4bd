"""KnownMessage: a ModelInferRequest that starts with the bytes its connection's messages started with
before is decoded from a plan exactly as parsing and decoding it in full would (the same target, request,
refusal and bytes counted); anything else is parsed in full (hostile cases, a crafted split, and a
hypothesis property against InferMessage without a plan)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

import appliance.grpc.service as service
from appliance.core.errors import ApplianceError
from appliance.engine.tensor_checks import DecodeLimits
from appliance.grpc.known_message import MAX_KNOWN_PREFIX, KnownMessage, _each_entry, _entries
from appliance.grpc.service import InferMessage

LIMITS = DecodeLimits()


def _message(values: np.ndarray, datatype: str = "FP32", *, request_id: str = "", parameters: dict | None = None,
             outputs: tuple[str, ...] = ("OUTPUT0",)) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id=request_id)
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=list(values.shape))
    del tensor
    for key, value in (parameters or {}).items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].int64_param = value
    for name in outputs:
        message.outputs.add(name=name)
    message.raw_input_contents.append(values.tobytes())
    return message


def _outcome(raw: bytes, known: KnownMessage | None, limits: DecodeLimits = LIMITS):
    """What InferMessage makes of ``raw``: the target, the request's fields, empty_final and the bytes
    counted; or the refusal."""
    source = InferMessage(raw, known=known)
    counted: list[int] = []
    try:
        target = source.target_now()
        request = source.decode(None, limits, counted.append)  # type: ignore[arg-type]
    except ApplianceError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "request_id", None)
    inputs = [(i.name, i.datatype, i.data.dtype.str, i.data.shape,
               i.data.tolist() if i.data.dtype == object else i.data.tobytes()) for i in request.inputs]
    return (target, inputs, [(o.name, o.parameters, o.shared_memory) for o in request.outputs], request.id,
            request.parameters, request.shared_inputs, source.empty_final, counted)


@pytest.fixture
def parses(monkeypatch):
    """The messages InferMessage parsed in full."""
    parsed = []
    real = service.parse_uncounted

    def counting(raw, method, deserializer):
        parsed.append(raw)
        return real(raw, method, deserializer)
    monkeypatch.setattr(service, "parse_uncounted", counting)
    return parsed


def test_a_message_that_starts_as_the_last_two_did_is_decoded_from_its_plan_with_its_own_bytes():
    known = KnownMessage()
    for step in range(6):
        values = np.arange(16, dtype=np.float32).reshape(1, 16) * step
        raw = _message(values, request_id="r", parameters={"sequence_id": 3,
                                                           "triton_enable_empty_final_response": True}
                       ).SerializeToString()
        planned = _outcome(raw, known)
        assert planned == _outcome(raw, None)
        assert planned[1][0][4] == values.tobytes() and planned[6] is True


def test_the_first_two_messages_are_parsed_then_none(parses):
    known = KnownMessage()
    for step in range(5):
        raw = _message(np.full((1, 4), step, np.int32), "INT32").SerializeToString()
        source = InferMessage(raw, known=known)
        source.target_now()
        source.decode(None, LIMITS, lambda n: None)  # type: ignore[arg-type]
    assert len(parses) == 2


def _hostile() -> dict[str, tuple[bytes, bytes]]:
    """A good message (to plan on), and a hostile one that starts with its leading bytes."""
    good = _message(np.arange(4, dtype=np.int32).reshape(1, 4), "INT32").SerializeToString()
    head = good[:-18]  # (the entry: tag, length 16, 16 bytes)
    assert good[-18:-16] == b"\x3a\x10"
    return {
        "an entry too short for the shape": (good, head + b"\x3a\x0c" + b"\0" * 12),
        "an entry longer than the message": (good, head + b"\x3a\x20" + b"\0" * 16),
        "two entries": (good, good + b"\x3a\x00"),
        "another field after the entry": (good, good + b"\x1a\x01x"),
        "a field before the entry": (good, head + b"\x1a\x01x" + good[-18:]),
        "a varint that never ends": (good, head + b"\x3a" + b"\xff" * 10),
        "no entry": (good, head),
        "the entry's tag changed": (good, head + b"\x32\x10" + b"\0" * 16),
    }


@pytest.mark.parametrize("case", list(_hostile()))
def test_a_message_that_departs_from_the_plan_gets_what_the_full_parse_gives_it(case):
    good, hostile = _hostile()[case]
    known = KnownMessage()
    for _ in range(3):
        assert _outcome(good, known) == _outcome(good, None)
    assert _outcome(hostile, known) == _outcome(hostile, None)
    assert _outcome(good, known) == _outcome(good, None)


def test_leading_bytes_that_end_inside_a_field_get_no_plan(parses):
    # The entry comes first, then the ID, whose last bytes look like an entry of the same length: the
    # tail split off would end inside the ID. Messages made the same way are parsed in full every time.
    known = KnownMessage()
    for step in range(4):
        data = np.full(2, step, np.uint8).tobytes()
        tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="UINT8", shape=[2]).SerializeToString()
        raw = (b"\x0a\x01m" + b"\x3a\x02\x07\x07" + b"\x2a" + bytes([len(tensor)]) + tensor
               + b"\x1a\x06" + b"id" + b"\x3a\x02" + data)
        outcome = _outcome(raw, known)
        assert outcome == _outcome(raw, None)
        assert outcome[1][0][4] == b"\x07\x07" and outcome[3] == "id:\x02" + data.decode()
    assert len(parses) == 8


def test_messages_a_plan_cannot_take_are_parsed_every_time(parses):
    contents = _message(np.ones((1, 2), np.float32))
    contents.raw_input_contents.pop()
    contents.inputs[0].contents.fp32_contents.extend([1.0, 1.0])
    shared = _message(np.ones((1, 2), np.float32))
    shared.raw_input_contents.pop()
    shared.inputs[0].parameters["shared_memory_region"].string_param = "r"
    shared.inputs[0].parameters["shared_memory_byte_size"].int64_param = 8
    long = _message(np.ones((1, 2), np.float32), request_id="x" * MAX_KNOWN_PREFIX)
    for message in (contents, shared, long):
        raw = message.SerializeToString()
        parses.clear()
        known = KnownMessage()
        for _ in range(4):
            assert _outcome(raw, known) == _outcome(raw, None)
        assert len(parses) == 8


def test_other_limits_are_not_taken_from_a_plan_made_under_these():
    known = KnownMessage()
    raw = _message(np.zeros((1, 16), np.float32)).SerializeToString()
    for _ in range(3):
        _outcome(raw, known)
    tight = DecodeLimits(max_tensor_elements=8)
    assert _outcome(raw, known, tight) == _outcome(raw, None, tight)
    assert _outcome(raw, known, tight)[0] == "InvalidInput"


def test_each_planned_request_has_dicts_of_its_own():
    known = KnownMessage()
    raw = _message(np.zeros((1, 2), np.float32), parameters={"a": 1}).SerializeToString()
    for _ in range(3):
        source = InferMessage(raw, known=known)
        source.target_now()
        first = source.decode(None, LIMITS, lambda n: None)  # type: ignore[arg-type]
    first.parameters["added"] = True
    first.outputs[0].parameters["added"] = True
    source = InferMessage(raw, known=known)
    source.target_now()
    second = source.decode(None, LIMITS, lambda n: None)  # type: ignore[arg-type]
    assert second.parameters == {"a": 1} and second.outputs[0].parameters == {}


def test_a_planned_bytes_tensor_is_counted_and_refused_as_in_full():
    items = b"".join(len(t).to_bytes(4, "little") + t for t in (b"ab", b"c"))
    message = pb.ModelInferRequest(model_name="m", id="q")
    message.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2])
    message.raw_input_contents.append(items)
    known = KnownMessage()
    raw = message.SerializeToString()
    for _ in range(3):
        assert _outcome(raw, known) == _outcome(raw, None)
    message.raw_input_contents[0] = (5).to_bytes(4, "little") + items[4:]
    bad = message.SerializeToString()
    refused = _outcome(bad, known)
    assert refused == _outcome(bad, None) and refused[0] == "InputMismatch" and refused[2] == "q"


_DATATYPES = {"FP32": np.float32, "INT8": np.int8, "UINT16": np.uint16, "INT64": np.int64, "BOOL": np.bool_}


@st.composite
def _messages(draw):
    """Messages a client might send on one connection: one shape, other bytes; now and then one tampered
    with (cut, extended, a byte flipped)."""
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    datatype = draw(st.sampled_from(sorted(_DATATYPES)))
    itemsize = np.dtype(_DATATYPES[datatype]).itemsize
    out = []
    for _ in range(draw(st.integers(1, 6))):
        size = int(np.prod(shape)) * itemsize + draw(st.sampled_from([0, 0, 0, -1, 1]))
        data = draw(st.binary(min_size=max(size, 0), max_size=max(size, 0)))
        message = pb.ModelInferRequest(model_name="m", id=draw(st.sampled_from(["", "r"])))
        message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
        message.raw_input_contents.append(data)
        raw = message.SerializeToString()
        tamper = draw(st.sampled_from(["none", "none", "none", "cut", "extend", "flip"]))
        if tamper == "cut" and raw:
            raw = raw[:-1]
        elif tamper == "extend":
            raw += draw(st.binary(min_size=1, max_size=4))
        elif tamper == "flip" and raw:
            at = draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
        out.append(raw)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_messages(), st.integers(1, 3))
def test_whatever_a_connection_sends_the_plan_decodes_it_as_the_full_parse(messages, rounds):
    known = KnownMessage()
    for _ in range(rounds):
        for raw in messages:
            assert _outcome(raw, known) == _outcome(raw, None)


def _entry(size: int, varint: bytes | None = None) -> bytes:
    """A field-7 entry of ``size`` bytes (its length as ``varint`` where given, else the shortest)."""
    if varint is None:
        varint, rest = b"", size
        while True:
            varint += bytes([(rest & 0x7F) | (0x80 if rest >= 0x80 else 0)])
            rest >>= 7
            if not rest:
                break
    return b"\x3a" + varint + bytes(size)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 50), st.sampled_from([0, 1, 5, 127, 128, 300, 16_383, 16_384]),
       st.booleans(), st.booleans())
@example(b"", 0, 127, True, True)
@example(b"", 0, 16_384, True, True)
@example(b"\x3a\x80\x00", 0, 0, False, False)  # a length sent in two bytes though one would do
def test_one_entry_is_read_without_the_loop_exactly_as_the_loop_reads_it(prefix, start, size, whole, aligned):
    raw = prefix + (_entry(size) if whole else b"")
    start = len(prefix) if aligned else min(start, len(raw))
    read, looped = _entries(raw, start, 1), _each_entry(raw, start, 1)
    assert (read is None) == (looped is None)
    if read is not None:
        assert [bytes(chunk) for chunk in read] == [bytes(chunk) for chunk in looped]
