"""The gRPC port against a hostile HTTP/2 client: the conformance cases h2spec checks (frame sizes, stream
states, header and pseudo-header rules, flow control, SETTINGS, GOAWAY, CONTINUATION), and every known
flood. Frames are built by hand and the answers parsed with ``hyperframe`` (tests/http2_raw.py).

A connection error is a GOAWAY with the RFC's code and a malformed request a stream reset with
PROTOCOL_ERROR. A flood of frames that do no work is counted per connection and ends it with GOAWAY
ENHANCE_YOUR_CALM. While each flood runs,
/v2/health/live answers within a second and RSS stays within 200 MiB (tests.health_watch); the daemon
runs under a capped address space."""

from __future__ import annotations

import struct
import time

import pytest

from tests.health_watch import HealthWatch
from tests.http2_raw import (
    ACK,
    CONTINUATION,
    DATA,
    EMPTY_MESSAGE,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawHttp2,
    frame,
    request_fields,
)

ADDRESS_SPACE = 4 << 30
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, COMPRESSION_ERROR = 0, 1, 3, 5, 6, 9
REFUSED_STREAM, ENHANCE_YOUR_CALM = 7, 11


@pytest.fixture(scope="module")
def daemon(module_daemon):
    return module_daemon(None, prefix=("prlimit", f"--as={ADDRESS_SPACE}"))


def _settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in pairs)


def _connection_error(client: RawHttp2, code: int) -> None:
    outcome = client.settle()
    assert outcome.goaway == code or (outcome.goaway is None and outcome.closed and code != NO_ERROR), \
        f"expected GOAWAY({code}), got GOAWAY({outcome.goaway}), resets {outcome.resets}"


def _stream_error(client: RawHttp2, stream: int, code: int) -> None:
    """RFC 9113 lets a stream error be answered as a connection error of the same code."""
    outcome = client.settle()
    assert outcome.resets.get(stream) == code or outcome.goaway == code, \
        f"expected RST_STREAM({code}) on {stream}, got resets {outcome.resets}, GOAWAY({outcome.goaway}), " \
        f"statuses {outcome.statuses}"


# Conformance: each case sends its frames after the handshake; (kind, code): the error expected.
def _frame_too_large(c):
    return c.headers(1, request_fields()) + frame(DATA, 0, 1, bytes(16_385))


CONNECTION_ERRORS = {
    "a frame above SETTINGS_MAX_FRAME_SIZE (4.2)": (_frame_too_large, FRAME_SIZE_ERROR),
    "SETTINGS ack with a payload (6.5)": (lambda c: frame(SETTINGS, ACK, 0, _settings((1, 4096))), FRAME_SIZE_ERROR),
    "SETTINGS on a stream (6.5)": (lambda c: frame(SETTINGS, 0, 1), PROTOCOL_ERROR),
    "SETTINGS not a multiple of 6 (6.5)": (lambda c: frame(SETTINGS, 0, 0, b"\x00\x03\x00"), FRAME_SIZE_ERROR),
    "SETTINGS_ENABLE_PUSH of 2 (6.5.2)": (lambda c: frame(SETTINGS, 0, 0, _settings((2, 2))), PROTOCOL_ERROR),
    "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1 (6.5.2)":
        (lambda c: frame(SETTINGS, 0, 0, _settings((4, 2**31))), FLOW_CONTROL_ERROR),
    "SETTINGS_MAX_FRAME_SIZE below 16384 (6.5.2)":
        (lambda c: frame(SETTINGS, 0, 0, _settings((5, 16_383))), PROTOCOL_ERROR),
    "PING on a stream (6.7)": (lambda c: frame(PING, 0, 1, bytes(8)), PROTOCOL_ERROR),
    "PING of 6 bytes (6.7)": (lambda c: frame(PING, 0, 0, bytes(6)), FRAME_SIZE_ERROR),
    "HEADERS on stream 0 (6.2)": (lambda c: c.headers(0, request_fields()), PROTOCOL_ERROR),
    "HEADERS on an even stream (5.1.1)": (lambda c: c.headers(2, request_fields()), PROTOCOL_ERROR),
    "a stream id below the last one (5.1.1)":
        (lambda c: c.call(5) + c.headers(3, request_fields()), PROTOCOL_ERROR),
    "a header block interrupted by PING (6.10)":
        (lambda c: c.headers(1, request_fields(), 0) + frame(PING, 0, 0, bytes(8)), PROTOCOL_ERROR),
    "CONTINUATION without HEADERS (6.10)":
        (lambda c: frame(CONTINUATION, END_HEADERS, 1, c.encoder.encode(request_fields())), PROTOCOL_ERROR),
    "a header block that is not HPACK (4.3)": (lambda c: frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\xff"),
                                               COMPRESSION_ERROR),
    "DATA on an idle stream (5.1)": (lambda c: frame(DATA, 0, 1, EMPTY_MESSAGE), PROTOCOL_ERROR),
    "DATA on stream 0 (6.1)": (lambda c: frame(DATA, 0, 0, EMPTY_MESSAGE), PROTOCOL_ERROR),
    "RST_STREAM on an idle stream (6.4)": (lambda c: frame(RST_STREAM, 0, 1, bytes(4)), PROTOCOL_ERROR),
    "RST_STREAM of 3 bytes (6.4)":
        (lambda c: c.headers(1, request_fields()) + frame(RST_STREAM, 0, 1, bytes(3)), FRAME_SIZE_ERROR),
    "WINDOW_UPDATE of 0 on the connection (6.9)":
        (lambda c: frame(WINDOW_UPDATE, 0, 0, bytes(4)), PROTOCOL_ERROR),
    "the connection's window past 2^31-1 (6.9.1)":
        (lambda c: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)), FLOW_CONTROL_ERROR),
    "WINDOW_UPDATE of 3 bytes (6.9)": (lambda c: frame(WINDOW_UPDATE, 0, 0, bytes(3)), FRAME_SIZE_ERROR),
    "PUSH_PROMISE from a client (8.4)": (lambda c: frame(PUSH_PROMISE, END_HEADERS, 1, bytes(4)), PROTOCOL_ERROR),
    "DATA past the stream's window (6.9.1)": (
        lambda c: c.headers(1, request_fields()) + b"".join(frame(DATA, 0, 1, bytes(16_384)) for _ in range(5)),
        FLOW_CONTROL_ERROR),
}


def _fields(*replace: tuple[str, str], drop: str = "", prepend: tuple[str, str] | None = None):
    fields = [field for field in request_fields() if field[0] != drop]
    for name, value in replace:
        fields.append((name, value))
    return [prepend, *fields] if prepend else fields


STREAM_ERRORS = {
    "an upper-case header name (8.2.1)": lambda c: c.headers(1, _fields(("X-Upper", "1"))),
    "a pseudo-header after a regular one (8.3)": lambda c: c.headers(1, _fields((":authority", "x"),
                                                                                 drop=":authority")),
    "an unknown pseudo-header (8.3)": lambda c: c.headers(1, _fields((":bogus", "1"))),
    "a response pseudo-header in a request (8.3)": lambda c: c.headers(1, _fields(prepend=(":status", "200"))),
    "a repeated pseudo-header (8.3.1)": lambda c: c.headers(1, _fields(prepend=(":path", "/x"))),
    "no :path (8.3.1)": lambda c: c.headers(1, _fields(drop=":path")),
    "no :method (8.3.1)": lambda c: c.headers(1, _fields(drop=":method")),
    "an empty :path (8.3.1)": lambda c: c.headers(1, _fields(prepend=(":path", ""), drop=":path")),
    "a connection-specific header (8.2.2)": lambda c: c.headers(1, _fields(("connection", "keep-alive"))),
    "te other than trailers (8.2.2)": lambda c: c.headers(1, _fields(("te", "gzip"), drop="te")),
    "trailers with a pseudo-header (8.1)": lambda c: (c.headers(1, request_fields()) + frame(DATA, 0, 1, EMPTY_MESSAGE)
                                                      + c.headers(1, [(":path", "/x")], END_HEADERS | END_STREAM)),
    "content-length not the DATA sent (8.1.1)": lambda c: (c.headers(1, _fields(("content-length", "10")))
                                                           + frame(DATA, END_STREAM, 1, EMPTY_MESSAGE)),
}


def _others_served(daemon) -> None:
    with RawHttp2(daemon.grpc_port).handshake() as other:
        other.send(other.call(1))
        assert other.status(1) == "0"


@pytest.mark.parametrize("case", CONNECTION_ERRORS)
def test_connection_errors_end_the_connection_with_their_code(daemon, case):
    build, code = CONNECTION_ERRORS[case]
    with RawHttp2(daemon.grpc_port).handshake() as client:
        client.send(build(client))
        _connection_error(client, code)


@pytest.mark.parametrize("case", STREAM_ERRORS)
def test_malformed_requests_are_stream_errors(daemon, case):
    with RawHttp2(daemon.grpc_port).handshake() as client:
        client.send(STREAM_ERRORS[case](client))
        _stream_error(client, 1, PROTOCOL_ERROR)
        assert client.outcome.goaway is None  # a stream error: the connection serves the next call
        client.send(client.call(3))
        assert client.status(3) == "0"


def test_frames_after_a_stream_closed_are_stream_closed(daemon):
    with RawHttp2(daemon.grpc_port).handshake() as client:
        client.send(client.call(1))
        assert client.status(1) == "0"
        client.send(frame(DATA, 0, 1, EMPTY_MESSAGE))
        _stream_error(client, 1, STREAM_CLOSED)


def test_settings_are_acknowledged_and_unknown_frames_and_settings_ignored(daemon):
    with RawHttp2(daemon.grpc_port).handshake() as client:
        client.send(frame(SETTINGS, 0, 0, _settings((0x99, 7), (4, 100_000))) + frame(0xEE, 0, 0, b"unknown")
                    + frame(PRIORITY, 0, 1, bytes(5)) + client.call(3))
        assert client.status(3) == "0"
        assert client.outcome.settings_acks >= 1 and client.outcome.goaway is None


def test_goaway_from_the_client_lets_open_calls_finish(daemon):
    with RawHttp2(daemon.grpc_port).handshake() as client:
        client.send(client.headers(1, request_fields()) + frame(7, 0, 0, struct.pack(">II", 1, 0))
                    + frame(DATA, END_STREAM, 1, EMPTY_MESSAGE))
        assert client.until(lambda got: got.type == HEADERS and got.stream_id == 1 and "END_STREAM" in got.flags)


# Floods: sent as fast as the socket takes them, for at most FLOOD_SECONDS or FLOOD_FRAMES.
FLOOD_FRAMES = 100_000
FLOOD_SECONDS = 15.0


def _flood(client: RawHttp2, unit: bytes, frames: int = FLOOD_FRAMES) -> int:
    """Send ``unit`` ``frames`` times in batches; the number sent before the server closed (or stopped
    reading for the socket's timeout)."""
    batch = 1000
    sent = 0
    deadline = time.monotonic() + FLOOD_SECONDS
    client.sock.settimeout(2.0)
    while sent < frames and time.monotonic() < deadline:
        if not client.send(unit * batch):
            break
        sent += batch
    client.sock.settimeout(5.0)
    return sent


METADATA = "/inference.GRPCInferenceService/ModelMetadata"


def _held_calls(client: RawHttp2, count: int) -> None:
    """``count`` ModelMetadata calls opened and never sent their message: open streams to walk (ServerLive
    would not do: it reads no message and is answered at once)."""
    client.send(b"".join(client.headers(stream, request_fields(METADATA)) for stream in range(1, 2 * count, 2)))


FLOODS = {
    "SETTINGS, 1000 calls open (round 4 high 1)":
        (lambda c: (_held_calls(c, 1000), frame(SETTINGS, 0, 0, _settings((4, 70_000))) + frame(
            SETTINGS, 0, 0, _settings((4, 65_535))))[1]),
    "empty CONTINUATION (round 4 high 2)": lambda c: (c.send(c.headers(1, request_fields(), 0)),
                                                     frame(CONTINUATION, 0, 1))[1],
    "empty DATA": lambda c: (_held_calls(c, 1), frame(DATA, 0, 1))[1],
    "PING": lambda c: frame(PING, 0, 0, bytes(8)),
    "WINDOW_UPDATE": lambda c: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)),
    "PRIORITY": lambda c: frame(PRIORITY, 0, 1, bytes(5)),
    "unknown frame types": lambda c: frame(0xEE, 0, 0, b""),
    "empty HEADERS fragments": lambda c: frame(HEADERS, 0, 1),
}
RAPID_RESET = "rapid reset (HEADERS then RST_STREAM)"


@pytest.mark.parametrize("case", [*FLOODS, RAPID_RESET])
def test_floods_are_cut_off_and_the_daemon_stays_healthy(daemon, case):
    with HealthWatch(daemon, keep_alive=False), RawHttp2(daemon.grpc_port).handshake() as client:
        if case == RAPID_RESET:
            unit = b"".join(client.headers(stream, request_fields()) + frame(RST_STREAM, 0, stream, struct.pack(
                ">I", 8)) for stream in range(1, 20_001, 2))
            client.sock.settimeout(2.0)
            client.send(unit)
        else:
            _flood(client, FLOODS[case](client))
        client.sock.settimeout(5.0)
        outcome = client.settle(10.0)
        assert outcome.goaway == ENHANCE_YOUR_CALM or (case.startswith("empty HEADERS") and outcome.goaway
                                                        == PROTOCOL_ERROR), (outcome.goaway, outcome.closed)
    _others_served(daemon)


def test_many_clients_within_the_flood_limits_are_not_cut_off(daemon):
    """What a well-behaved client sends (a few SETTINGS and PINGs, window updates, calls) is never a flood."""
    with RawHttp2(daemon.grpc_port).handshake() as client:
        for stream in range(1, 400, 2):
            client.send(client.call(stream) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1000))
                        + (frame(PING, 0, 0, bytes(8)) if stream % 40 == 1 else b""))
        client.until(lambda got: len(client.outcome.statuses) == 200 or got.type == 7, 30.0)
        assert client.outcome.goaway is None and set(client.outcome.statuses.values()) == {"0"}


@pytest.fixture(scope="module")
def idle_daemon(module_daemon):
    return module_daemon(None, env={"APPLIANCE_HEADER_TIMEOUT": "2"})


def test_pings_do_not_keep_an_idle_connection_open(idle_daemon):
    """Medium of round 4: a client pinging an idle connection held it (and its slot) for ever."""
    with RawHttp2(idle_daemon.grpc_port).handshake() as client:
        client.send(client.call(1))
        assert client.status(1) == "0"
        client.sock.settimeout(0.5)
        deadline = time.monotonic() + 8.0  # the idle timeout is 2 s
        while time.monotonic() < deadline and not client.outcome.closed and client.send(frame(PING, 0, 0, bytes(8))):
            while client.read() is not None:  # the ack, then nothing for half a second: two pings a second
                pass
        assert client.outcome.closed, "the pinging idle connection stayed open"
        assert client.outcome.goaway in (None, NO_ERROR), "closed as idle, not as a flood"
