"""One HTTP/2 connection of the gRPC port: frames in, calls out (RFC 9113, as gRPC uses it).

What a client can make it hold: the bytes of one frame (``MAX_FRAME``), one header block
(``MAX_HEADER_BLOCK``), and per stream its small window until a handler admits the call and reads it
(``appliance.grpc.http2.call``); at most ``max_streams`` streams at once (SETTINGS_MAX_CONCURRENT_STREAMS,
REFUSED_STREAM above it). While the client does not read what is sent to it, reading pauses. A broken
frame ends the connection with GOAWAY and the error's code."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Protocol, cast

import grpc
import hpack

from appliance.grpc.config import KEEPALIVE, KEEPALIVE_TIMEOUT, GrpcConfig
from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.call import STREAM_WINDOW, Call
from appliance.grpc.http2.frames import Error, FrameError
from appliance.grpc.http2.headers import HeaderDecoder

__all__ = ["Host", "Http2Connection"]

log = logging.getLogger(__name__)

MAX_FRAME = f.DEFAULT_FRAME_SIZE
MAX_HEADER_LIST = 16 * 1024
MAX_HEADER_BLOCK = 64 * 1024
UNREAD_LIMIT = 1024**2
"""Bytes a connection's calls may hold that no handler reads yet (calls waiting for admission or a
receive slot); past it the stream holding most is refused."""
RESET_BURST = 1000
RESET_RATE = 100.0
CONNECTION_WINDOW = 16 * 1024**2
"""The connection's receive window: streams' own windows bound what is held."""


class Host(Protocol):
    """What a connection needs of its server (``appliance.grpc.http2.server.Http2Server``)."""

    loop: asyncio.AbstractEventLoop
    config: GrpcConfig

    def handler(self, path: bytes) -> grpc.RpcMethodHandler | None: ...

    def opened(self, connection: Http2Connection) -> bool: ...

    def closed(self, connection: Http2Connection) -> None: ...


def _peer(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return "unix:"


class Http2Connection(asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self._server = server
        self.loop = server.loop
        self.max_message = server.config.max_message_bytes
        self.peer = "unix:"
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._preface = False
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._continuation: tuple[int, int, list[bytes], int] | None = None
        self._decoder = HeaderDecoder(MAX_HEADER_LIST)
        self._settings_acked = False
        self.send_window = f.DEFAULT_WINDOW
        self._stream_send_window = f.DEFAULT_WINDOW
        self.max_frame = f.DEFAULT_FRAME_SIZE
        self._receive_window = CONNECTION_WINDOW
        self._waiting_window: set[Call] = set()
        self._unread = 0
        self._resets = float(RESET_BURST)
        self._resets_at = self.loop.time()
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._going_away = False
        self._closed = False
        self._heard = self.loop.time()
        self._ping_sent: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self._server.opened(self):
            self._closed = True
            transport.abort()  # over max_connections: as grpc's max_allowed_incoming_connections
            return
        self.peer = _peer(transport.get_extra_info("peername"))
        transport.write(f.settings({f.MAX_CONCURRENT_STREAMS: self._server.config.max_streams_per_connection,
                                    f.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                                    f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
                        + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self._arm(self._server.config.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for call in list(self._calls.values()):
            call.reset()
        self._calls.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._server.closed(self)

    def pause_writing(self) -> None:
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()  # a client that does not read gets nothing more read either

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None and not self._closed:
            self.transport.resume_reading()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._heard = self.loop.time()
        buffer = self._buffer
        buffer += data
        position = 0
        try:
            if not self._preface:
                if len(buffer) < len(f.PREFACE):
                    if not f.PREFACE.startswith(bytes(buffer)):
                        raise FrameError(Error.PROTOCOL_ERROR, "not the HTTP/2 client preface")
                    return
                if buffer[:len(f.PREFACE)] != f.PREFACE:
                    raise FrameError(Error.PROTOCOL_ERROR, "not the HTTP/2 client preface")
                self._preface = True
                position = len(f.PREFACE)
            end = len(buffer)
            while end - position >= 9:
                word, flags, stream = f.HEAD.unpack_from(buffer, position)
                length = word >> 8
                if length > MAX_FRAME:
                    raise FrameError(Error.FRAME_SIZE_ERROR, f"a frame of {length} bytes, above {MAX_FRAME}")
                start = position + 9
                if end - start < length:
                    break
                position = start + length
                self._frame(word & 0xFF, flags, stream & 0x7FFF_FFFF, bytes(buffer[start:position]))
                if self._closed:
                    return
        except FrameError as exc:
            self._fail(exc.code, str(exc))
            return
        del buffer[:position]
        if self._receive_window < CONNECTION_WINDOW // 2 and not self._closed:
            self.write(f.window_update(0, CONNECTION_WINDOW - self._receive_window))
            self._receive_window = CONNECTION_WINDOW

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    # Frames

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise FrameError(Error.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if kind == f.DATA:
            self._data(flags, stream, payload)
        elif kind == f.HEADERS:
            self._headers(flags, stream, payload)
        elif kind == f.CONTINUATION:
            self._continued(flags, stream, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == f.SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == f.PING:
            if stream or len(payload) != 8:
                raise FrameError(Error.FRAME_SIZE_ERROR if len(payload) != 8 else Error.PROTOCOL_ERROR, "bad PING")
            if flags & f.ACK:
                self._ping_sent = None
            else:
                self.write(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.RST_STREAM:
            if len(payload) != 4:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a RST_STREAM frame is 4 bytes")
            if stream == 0 or stream > self._last_stream:
                raise FrameError(Error.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream}")
            call = self._calls.get(stream)
            if call is not None:
                self.forget(call)
                call.reset()
                self._count_reset()
        elif kind == f.GOAWAY:
            self._going_away = True  # the client opens no new streams; the open ones finish
        elif kind == f.PRIORITY:
            if len(payload) != 5:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a PRIORITY frame is 5 bytes")
        elif kind == f.PUSH_PROMISE:
            raise FrameError(Error.PROTOCOL_ERROR, "a client cannot push")
        # other frame types are ignored (RFC 9113 section 4.1)

    def _data(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0:
            raise FrameError(Error.PROTOCOL_ERROR, "DATA on stream 0")
        counted = len(payload)
        self._receive_window -= counted
        if self._receive_window < 0:
            raise FrameError(Error.FLOW_CONTROL_ERROR, "the client sent past the connection's window")
        call = self._calls.get(stream)
        if call is None:
            if stream > self._last_stream:
                raise FrameError(Error.PROTOCOL_ERROR, f"DATA on idle stream {stream}")
            return  # a stream already answered or reset: dropped
        call.data(f.unpadded(payload, flags), counted, bool(flags & f.END_STREAM))

    def _headers(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0:
            raise FrameError(Error.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = f.unpadded(payload, flags)
        if flags & f.PRIORITY_FLAG:
            if len(block) < 5:
                raise FrameError(Error.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if flags & f.END_HEADERS:
            self._header_block(flags, stream, block)
        else:
            self._continuation = (stream, flags, [block], len(block))

    def _continued(self, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream:
            raise FrameError(Error.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, first_flags, parts, size = self._continuation
        size += len(payload)
        if size > MAX_HEADER_BLOCK:
            raise FrameError(Error.ENHANCE_YOUR_CALM, f"a header block above {MAX_HEADER_BLOCK} bytes")
        parts.append(payload)
        self._continuation = (stream, first_flags, parts, size)
        if flags & f.END_HEADERS:
            self._continuation = None
            self._header_block(first_flags, stream, b"".join(parts))

    def _header_block(self, flags: int, stream: int, block: bytes) -> None:
        try:
            request = self._decoder.decode(block)
        except hpack.HPACKError as exc:
            raise FrameError(Error.COMPRESSION_ERROR, f"the header block is not HPACK: {exc}") from None
        call = self._calls.get(stream)
        if call is not None:  # trailers: a request's stream ends
            if not flags & f.END_STREAM:
                raise FrameError(Error.PROTOCOL_ERROR, f"a second header block on stream {stream} without its end")
            call.remote_end()
            return
        if not stream % 2:
            raise FrameError(Error.PROTOCOL_ERROR, f"HEADERS opening stream {stream}: a client's streams are odd")
        if stream <= self._last_stream:
            return  # trailers on a stream already answered and reset: ignored (the table took the block)
        self._last_stream = stream
        if self._going_away or len(self._calls) >= self._server.config.max_streams_per_connection:
            self.write(f.rst_stream(stream, Error.REFUSED_STREAM))
            return
        receive = STREAM_WINDOW if self._settings_acked else f.DEFAULT_WINDOW
        call = Call(self, stream, request, receive, self._stream_send_window)
        self._calls[stream] = call
        if flags & f.END_STREAM:
            call.remote_ended = True
        call.start(self._server.handler(request.path))

    def _count_reset(self) -> None:
        """Calls a client cancels cost a started handler each: past ``RESET_BURST`` of them, refilled at
        ``RESET_RATE`` a second, the connection ends (HTTP/2 "rapid reset", CVE-2023-44487)."""
        now = self.loop.time()
        self._resets = min(RESET_BURST, self._resets + (now - self._resets_at) * RESET_RATE) - 1
        self._resets_at = now
        if self._resets < 0:
            raise FrameError(Error.ENHANCE_YOUR_CALM, f"more than {RESET_BURST} calls cancelled at a rate above "
                                                      f"{RESET_RATE:g} a second")

    def _window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise FrameError(Error.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame is 4 bytes")
        increment = struct.unpack(">I", payload)[0] & 0x7FFF_FFFF
        if stream == 0:
            if increment == 0:
                raise FrameError(Error.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise FrameError(Error.FLOW_CONTROL_ERROR, "the connection's window above 2^31-1")
            waiting, self._waiting_window = self._waiting_window, set()
            for blocked in waiting:
                blocked.window_opened()
            return
        call = self._calls.get(stream)
        if call is None:
            return
        if increment == 0:
            raise FrameError(Error.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        call.send_window += increment
        if call.send_window > f.MAX_WINDOW:
            raise FrameError(Error.FLOW_CONTROL_ERROR, f"stream {stream}'s window above 2^31-1")
        call.window_opened()

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream:
            raise FrameError(Error.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            self._settings_acked = True
            return
        values = f.parse_settings(payload)
        if f.INITIAL_WINDOW_SIZE in values:
            delta = values[f.INITIAL_WINDOW_SIZE] - self._stream_send_window
            self._stream_send_window = values[f.INITIAL_WINDOW_SIZE]
            for call in self._calls.values():
                call.send_window += delta
                if call.send_window > f.MAX_WINDOW:
                    raise FrameError(Error.FLOW_CONTROL_ERROR, "a stream's window above 2^31-1")
                call.window_opened()
        if f.MAX_FRAME_SIZE in values:
            self.max_frame = values[f.MAX_FRAME_SIZE]
        self.write(f.frame(f.SETTINGS, f.ACK, 0))

    # What calls use

    def write(self, data: bytes) -> None:
        """Queue ``data``; what the calls of one turn of the event loop write goes in one send (a send on
        loopback costs more than the answers it carries)."""
        if self._closed:
            return
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if not self._closed and self.transport is not None and out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    async def drain(self) -> None:
        """Wait while the client reads slower than it is answered."""
        while self._paused and not self._closed:
            if self._drained is None or self._drained.done():
                self._drained = self.loop.create_future()
            await self._drained

    def wait_window(self, call: Call) -> None:
        self._waiting_window.add(call)

    def open_stream_window(self, stream: int, increment: int) -> None:
        self.write(f.window_update(stream, increment))

    def forget(self, call: Call) -> None:
        if self._calls.get(call.stream) is call:
            del self._calls[call.stream]
        self._waiting_window.discard(call)
        self.release(call.unread)
        call.unread = 0

    def hold(self, call: Call, size: int) -> bool:
        """Count ``size`` more bytes ``call`` holds that its handler does not read (yet); past
        ``UNREAD_LIMIT`` the stream holding most is refused (REFUSED_STREAM: gRPC clients retry it).
        False when that is ``call``."""
        self._unread += size
        if self._unread <= UNREAD_LIMIT:
            return True
        over = max(self._calls.values(), key=lambda held: held.unread)
        self.forget(over)
        over.reset()
        self.write(f.rst_stream(over.stream, Error.REFUSED_STREAM))
        return over is not call

    def release(self, size: int) -> None:
        self._unread -= size

    # Lifecycle

    def _fail(self, code: int, message: str) -> None:
        log.debug("gRPC connection from %s: %s", self.peer, message)
        self.write(f.goaway(self._last_stream, code, message.encode("utf-8", "replace")[:256]))
        self.close()

    def go_away(self) -> None:
        """The server stops: no new streams; the open ones finish (or are cancelled at the deadline)."""
        if not self._going_away:
            self._going_away = True
            self.write(f.goaway(self._last_stream, Error.NO_ERROR))
        if not self._calls:
            self.close()

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._flush()
            self._closed = True
            self.transport.close()

    def _arm(self, delay: float) -> None:
        self._timer = self.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        """The handshake and idle timeouts, and keepalive pings on connections with calls open."""
        if self._closed:
            return
        idle = self._server.config.idle_timeout
        now = self.loop.time()
        silent = now - self._heard
        if not self._preface or (not self._calls and silent >= idle):
            self._fail(Error.NO_ERROR, "idle")
            return
        if self._calls and self._ping_sent is not None and now - self._ping_sent >= KEEPALIVE_TIMEOUT:
            self._fail(Error.ENHANCE_YOUR_CALM, "no answer to a keepalive ping")
            return
        if self._calls and silent >= KEEPALIVE and self._ping_sent is None:
            self._ping_sent = now
            self.write(f.frame(f.PING, 0, 0, b"\x00" * 8))
        self._arm(min(idle, KEEPALIVE_TIMEOUT) / 2 if self._calls else max(0.05, idle - silent))

    async def cancel_calls(self, grace: float) -> None:
        """Cancel the handlers still running (the server stops) and give them ``grace`` seconds."""
        tasks = [task for call in list(self._calls.values()) if (task := call.cancel()) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
