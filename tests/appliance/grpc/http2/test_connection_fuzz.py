"""Property-based fuzzing of the own HTTP/2 transport's decoding (``hypothesis``): whatever bytes a client
sends, in whatever pieces, the connection either goes on or ends itself with GOAWAY; no exception escapes
``data_received``, nothing it holds outgrows a frame, and a header block of any fields becomes a request
(well-formed or not) without an error. Calls are served both from a task and without one (a call whose
message came whole with its headers, ``Call.start_pending``)."""

from __future__ import annotations

import asyncio
import struct

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.connection import MAX_FRAME, Http2Connection
from appliance.grpc.http2.headers import Request
from tests.appliance.grpc.http2.hosts import EchoHost, RecordingTransport
from tests.waiting import next_turn

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """One turn of the loop: what the connection scheduled runs (handlers, writes flushed)."""
    loop.run_until_complete(next_turn())


def _feed(chunks: list[bytes]) -> tuple[Http2Connection, RecordingTransport]:
    loop = asyncio.new_event_loop()
    try:
        connection = Http2Connection(EchoHost(loop))
        transport = RecordingTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        for chunk in chunks:
            connection.data_received(chunk)  # must never raise
            _settle(loop)
            assert len(connection._buffer) <= MAX_FRAME + 9, "more than a frame held"
            if transport.closing:
                break
        connection.connection_lost(None)
        _settle(loop)
        return connection, transport
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        _settle(loop)
        loop.close()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)]) if b > a]


_FIELDS = st.lists(st.tuples(st.sampled_from([b":method", b":path", b":scheme", b":authority", b":status",
                                               b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                                               b"content-length", b"X-Up", b"connection", b"a-bin", b"k"]),
                             st.binary(max_size=12)), max_size=10)
_GOOD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/t.S/Echo"), (b":authority", b"x"),
         (b"content-type", b"application/grpc"), (b"te", b"trailers")]


@st.composite
def _frames(draw) -> bytes:
    """A client's frames: well-formed calls, fuzzed header blocks, and frames of any type, flags, stream
    and payload (lengths true or not)."""
    encoder = hpack.Encoder()
    out = [f.PREFACE, f.settings({})]
    for _ in range(draw(st.integers(1, 12))):
        stream = draw(st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            message = draw(st.binary(max_size=40))
            path = draw(st.sampled_from([b"/t.S/Echo", b"/t.S/Fast"]))
            headers = [(name, path if name == b":path" else value) for name, value in _GOOD]
            out.append(f.frame(f.HEADERS, f.END_HEADERS, stream, encoder.encode(headers))
                       + f.frame(f.DATA, f.END_STREAM, stream, b"\x00" + struct.pack(">I", len(message)) + message))
        elif choice == 1:
            fields = draw(_FIELDS)
            out.append(f.frame(f.HEADERS, draw(st.sampled_from([0, f.END_HEADERS, f.END_HEADERS | f.END_STREAM])),
                               stream, encoder.encode(fields)))
        else:
            kind = draw(st.integers(0, 12))
            flags = draw(st.integers(0, 255))
            payload = draw(st.binary(max_size=64))
            out.append(f.frame(kind, flags, stream, payload))
    return b"".join(out)


def _decode_answers(written: bytes) -> list[list[tuple[bytes, bytes]]]:
    """The header blocks the server wrote, read in order by one HPACK decoder (the client's), which holds
    them to its table (4096 bytes, what the server uses at most whatever a client's SETTINGS say)."""
    decoder = hpack.Decoder()
    blocks, position = [], 0
    while position < len(written):
        word, flags, _ = f.HEAD.unpack_from(written, position)
        payload = written[position + 9:position + 9 + (word >> 8)]
        position += 9 + (word >> 8)
        if word & 0xFF == f.HEADERS:
            assert flags & f.END_HEADERS, "the server's header blocks fit one frame"
            blocks.append(decoder.decode(bytes(payload), raw=True))
    return blocks


@FUZZ
@given(_frames(), st.lists(st.integers(0, 10_000), max_size=8))
def test_any_frames_in_any_pieces_never_break_the_connection(data, cuts):
    _, transport = _feed(_split(data, cuts))
    for block in _decode_answers(bytes(transport.written)):  # whatever the client sent, the answers decode
        assert block[0][0] in (b":status", b"grpc-status")


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=4))
def test_any_bytes_after_the_preface_end_in_goaway_or_wait(data, cuts):
    connection, transport = _feed([f.PREFACE, *_split(data, cuts)])
    if transport.closing:
        assert struct.pack(">B", f.GOAWAY) in transport.written, "closed without a GOAWAY"


@FUZZ
@given(st.lists(st.tuples(st.binary(max_size=16), st.binary(max_size=16)), max_size=16))
def test_any_header_fields_make_a_request_or_a_reason(fields):
    request = Request(fields)
    assert request.malformed is None or isinstance(request.malformed, str)
    if request.malformed is None and not request.trailer:
        assert request.path  # a well-formed request routes somewhere


@pytest.mark.parametrize("path", [b"/t.S/Echo", b"/t.S/Fast"])
def test_a_well_formed_call_is_answered(path):
    """The fuzzer's own control: the shape it mutates is served, from a task and without one."""
    encoder = hpack.Encoder()
    headers = [(name, path if name == b":path" else value) for name, value in _GOOD]
    call = (f.PREFACE + f.settings({}) + f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(headers))
            + f.frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x02hi"))
    _, transport = _feed([call])
    assert b"\x00\x00\x00\x00\x02hi" in transport.written and not transport.closing
    assert _decode_answers(bytes(transport.written)) == [
        [(b":status", b"200"), (b"content-type", b"application/grpc"),
         (b"grpc-accept-encoding", b"identity,deflate,gzip")],
        [(b"grpc-status", b"0")]]
