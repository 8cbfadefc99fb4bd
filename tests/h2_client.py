"""A gRPC client on the ``h2`` state machine for tests that send what grpcio's client never does: a
message flagged compressed whose bytes the test made itself, a length prefix followed by nothing. Flow
control is h2's: a message is sent as fast as the server's windows let it, or stalls there."""

from __future__ import annotations

import socket
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions

__all__ = ["H2Grpc", "framed"]


def framed(message: bytes, compressed: bool = False) -> bytes:
    """A gRPC message: its flag, its 4-byte length, its bytes."""
    return bytes([1 if compressed else 0]) + len(message).to_bytes(4, "big") + message


class H2Grpc:
    """One connection to 127.0.0.1:``port``; calls by stream id. ``settled``: the server's SETTINGS are
    read (and acknowledged) before any call starts, else calls may go out under HTTP/2's default windows,
    as grpc-core's clients send their first ones."""

    def __init__(self, port: int, timeout: float = 10.0, settled: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.trailers: dict[int, dict[str, str]] = {}
        self.ended: set[int] = set()
        self.window_opened: set[int] = set()
        """Streams the server opened its window on (a handler reads them)."""
        self.closed = False
        self._settings = False
        self._flush()
        until = time.monotonic() + timeout
        while settled and not self._settings and not self.closed:
            assert time.monotonic() < until, "the server sent no SETTINGS"
            self.pump(0.5)

    def __enter__(self) -> H2Grpc:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()

    def open(self, path: str, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """Start a call (its headers only); its stream id."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                        (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
                                        ("te", "trailers"), *metadata])
        self._flush()
        return stream

    def send(self, stream: int, data: bytes, end: bool = False, deadline: float = 60.0) -> bool:
        """Send ``data`` on ``stream`` as the windows let it; False when the call ended (or the connection
        did) before it was all sent."""
        view = memoryview(data)
        until = time.monotonic() + deadline
        while view:
            if stream in self.ended or self.closed:
                return False
            allowed = min(len(view), self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size)
            if allowed <= 0:
                if time.monotonic() > until:
                    raise AssertionError(f"stream {stream}'s window stayed shut for {deadline} s")
                self.pump(0.5)
                continue
            try:
                self.conn.send_data(stream, bytes(view[:allowed]))
            except h2.exceptions.StreamClosedError:
                return False
            view = view[allowed:]
            self._flush()
        if end:
            try:
                self.conn.end_stream(stream)
            except h2.exceptions.StreamClosedError:
                return False
            self._flush()
        return True

    def status(self, stream: int, seconds: float = 30.0) -> str | None:
        """The grpc-status ``stream`` ended with, waiting up to ``seconds`` (None: reset, or no answer)."""
        until = time.monotonic() + seconds
        while stream not in self.ended and not self.closed and time.monotonic() < until:
            self.pump(min(0.5, max(0.01, until - time.monotonic())))
        return self.trailers.get(stream, {}).get("grpc-status")

    def pump(self, seconds: float) -> None:
        """Read what the server sent within ``seconds`` and answer it (SETTINGS, PING, window updates)."""
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.WindowUpdated) and event.stream_id:
                self.window_opened.add(event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                self.trailers[event.stream_id] = dict(event.headers)
            elif isinstance(event, h2.events.ResponseReceived) and any(k == "grpc-status" for k, _ in event.headers):
                self.trailers[event.stream_id] = dict(event.headers)  # a Trailers-Only answer
            elif isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = True
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                self._settings = True
        self._flush()

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            try:
                self.sock.sendall(out)
            except OSError:
                self.closed = True
