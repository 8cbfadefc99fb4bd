"""A raw HTTP/2 client for the hostile suites: frames built by hand (any type, flags, stream and length,
including what no well-behaved client sends), header blocks with the ``hpack`` package, and what the server
answers parsed with ``hyperframe`` (the framing layer of the ``h2`` package): an implementation that is not
the appliance's own, so the suite does not test the server against itself."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterable

import hpack
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame, SettingsFrame

__all__ = ["LIVE", "PREFACE", "Outcome", "RawHttp2", "frame", "request_fields"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LIVE = "/inference.GRPCInferenceService/ServerLive"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
"""A gRPC message of no bytes (ServerLiveRequest has no fields)."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def request_fields(path: str = LIVE, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


class Outcome:
    """What the server did: ``goaway`` (its error code), ``resets`` (stream -> error code), ``statuses``
    (stream -> grpc-status of a finished call), ``closed`` (the connection ended)."""

    def __init__(self) -> None:
        self.goaway: int | None = None
        self.resets: dict[int, int] = {}
        self.statuses: dict[int, str] = {}
        self.pings: list[bytes] = []
        self.settings_acks = 0
        self.closed = False


class RawHttp2:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self._buffer = bytearray()
        self.outcome = Outcome()

    def __enter__(self) -> RawHttp2:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()

    def handshake(self) -> RawHttp2:
        """The preface and an empty SETTINGS; the server's SETTINGS acknowledged."""
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        self.until(lambda got: isinstance(got, SettingsFrame) and "ACK" not in got.flags)
        self.send(frame(SETTINGS, ACK, 0))
        return self

    def send(self, data: bytes) -> bool:
        """False once the server closed the connection (or stopped reading for the socket's timeout)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def headers(self, stream: int, fields: list[tuple[str, str]], flags: int = END_HEADERS) -> bytes:
        return frame(HEADERS, flags, stream, self.encoder.encode(fields))

    def call(self, stream: int, path: str = LIVE, message: bytes = EMPTY_MESSAGE) -> bytes:
        """A whole well-formed unary call on ``stream``."""
        return self.headers(stream, request_fields(path)) + frame(DATA, END_STREAM, stream, message)

    def read(self) -> Frame | None:
        """The next frame; None when the connection ended (``outcome.closed``) or nothing came for the
        socket's timeout."""
        while True:
            if len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) >= 9 + length:
                    try:
                        parsed, _ = Frame.parse_frame_header(memoryview(bytes(self._buffer[:9])))
                        parsed.parse_body(memoryview(bytes(self._buffer[9:9 + length])))
                    except HyperframeError as exc:
                        raise AssertionError(f"the server sent a broken frame: {exc}") from None
                    del self._buffer[:9 + length]
                    self._note(parsed)
                    return parsed
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                data = b""
            if not data:
                self.outcome.closed = True
                return None
            self._buffer += data

    def _note(self, got: Frame) -> None:
        outcome = self.outcome
        if isinstance(got, GoAwayFrame):
            outcome.goaway = got.error_code
        elif isinstance(got, RstStreamFrame):
            outcome.resets[got.stream_id] = got.error_code
        elif got.type == PING and "ACK" in got.flags:
            outcome.pings.append(bytes(got.opaque_data))
        elif isinstance(got, SettingsFrame) and "ACK" in got.flags:
            outcome.settings_acks += 1
        elif got.type == HEADERS:
            fields = dict(self._decoder.decode(bytes(got.data)))
            if "grpc-status" in fields:
                outcome.statuses[got.stream_id] = fields["grpc-status"]

    def until(self, found: Callable[[Frame], bool], seconds: float = 5.0) -> Frame | None:
        """Read until a frame ``found`` matches (returned) or the connection ends (None)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = self.read()
            if got is None and self.outcome.closed:
                return None
            if got is not None and found(got):
                return got
        raise AssertionError("the server neither answered nor closed in time")

    def status(self, stream: int, seconds: float = 10.0) -> str | None:
        """The grpc-status the call on ``stream`` ended with (None: reset, or the connection ended)."""
        self.until(lambda got: got.stream_id == stream and ("END_STREAM" in got.flags or got.type == RST_STREAM)
                   or isinstance(got, GoAwayFrame), seconds)
        return self.outcome.statuses.get(stream)

    def settle(self, seconds: float = 5.0) -> Outcome:
        """Send a PING and read until its answer (everything sent before it was handled) or the end."""
        marker = b"settled!"
        self.send(frame(PING, 0, 0, marker))  # a server that stopped reading still has its answers to read
        self.until(lambda got: got.type == PING and "ACK" in got.flags and bytes(got.opaque_data) == marker
                   or isinstance(got, GoAwayFrame), seconds)
        return self.outcome
