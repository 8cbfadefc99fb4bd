"""One HTTP/2 connection of the gRPC port: frames in, calls out (RFC 9113, as gRPC uses it).

What a client can make it hold: the bytes of one frame (``MAX_FRAME``), one header block
(``MAX_HEADER_BLOCK``), and per stream its small window until a handler admits the call and reads it
(``appliance.grpc.http2.call``); at most ``max_streams`` streams at once (SETTINGS_MAX_CONCURRENT_STREAMS,
REFUSED_STREAM above it). While the client does not read what is sent to it, reading pauses. A broken
frame ends the connection with GOAWAY and the error's code; a malformed request (RFC 9113 section 8) resets
its stream with PROTOCOL_ERROR. Frames that do no work (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, empty
ones, resets, refused streams) are counted per connection (``appliance.grpc.http2.floods``) and a header
block may span at most ``MAX_CONTINUATIONS`` frames: past either, GOAWAY(ENHANCE_YOUR_CALM). Only calls
keep a connection from being idle: pings and other control frames do not. Over TLS a connection whose
handshake did not select ALPN h2 is closed before a frame is sent."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, cast

import grpc
import hpack

from appliance.grpc.grpc_config import KEEPALIVE, KEEPALIVE_TIMEOUT, GrpcConfig
from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.call import STREAM_WINDOW, Call
from appliance.grpc.http2.floods import WINDOW_UPDATE_BUNCH, Flood, FloodMeter
from appliance.grpc.http2.frames import Error, FrameError
from appliance.grpc.http2.headers import HeaderDecoder, HeaderEncoder

__all__ = ["Host", "Http2Connection"]

log = logging.getLogger(__name__)

MAX_FRAME = f.DEFAULT_FRAME_SIZE
MAX_HEADER_LIST = 16 * 1024
MAX_HEADER_BLOCK = 64 * 1024
UNREAD_LIMIT = 1024**2
"""Bytes a connection's calls may hold that no handler reads yet (calls waiting for admission or a
receive slot); past it the stream holding most is refused."""
MAX_CONTINUATIONS = 64
"""CONTINUATION frames one header block may take (as the h2 library); a gRPC client's need one or none."""
CLOSED_REMEMBERED = 256
"""Closed streams a connection remembers and how each closed (RFC 9113 section 5.1): frames on one the
client closed are STREAM_CLOSED errors, on one the server reset they are ignored (they were on their way),
on one never opened below the last a PROTOCOL_ERROR; older streams are ignored."""
CLOSE_GRACE = 5.0
_INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
_INTERNAL_CODE = grpc.StatusCode.INTERNAL.value[0]
CONNECTION_WINDOW = 16 * 1024**2
"""The connection's receive window: streams' own windows bound what is held."""


class Host(Protocol):
    """What a connection needs of its server (``appliance.grpc.http2.server.Http2Server``)."""

    loop: asyncio.AbstractEventLoop
    config: GrpcConfig

    def handler(self, path: bytes) -> grpc.RpcMethodHandler | None: ...

    def opened(self, connection: Http2Connection) -> None: ...

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
        self._starting: list[Call] = []
        """Calls whose headers this read brought, started as it ends (``Call.start_pending``)."""
        self._preface = False
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._continuation: tuple[int, int, list[bytes], int] | None = None
        self._continuations = 0
        self._decoder = HeaderDecoder(MAX_HEADER_LIST)
        self.headers = HeaderEncoder()
        self._settings_acked = False
        self.send_window = f.DEFAULT_WINDOW
        self._stream_send_window = f.DEFAULT_WINDOW
        self.max_frame = f.DEFAULT_FRAME_SIZE
        self._receive_window = CONNECTION_WINDOW
        self._waiting_window: set[Call] = set()
        self._unread = 0
        self._floods = FloodMeter(self.loop.time())
        self._window_updates = 0
        """WINDOW_UPDATE frames not yet counted as a possible flood (counted by ``WINDOW_UPDATE_BUNCH``)."""
        self._ended_by_client: set[int] = set()
        """Open streams whose client sent END_STREAM or reset them."""
        self._closed_streams: dict[int, bool] = {}
        """Recently closed streams (at most ``CLOSED_REMEMBERED``): True where the client closed its side."""
        self._lengths: dict[int, list[int]] = {}
        """Streams that declared a content-length: [declared, received]."""
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._going_away = False
        self._closed = False
        self._heard = self.loop.time()
        """When the client last sent anything (keepalive: it is alive)."""
        self._busy_at = self._heard
        """When the connection last had a call open (idleness: only calls count, never pings)."""
        self._ping_sent: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() != "h2":
            # RFC 9113 section 3.2: over TLS, HTTP/2 is spoken only where ALPN selected h2; a client that
            # did not offer it asked for another protocol (every gRPC client offers it).
            self._closed = True
            transport.abort()
            return
        self._server.opened(self)
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
                kind = word & 0xFF
                if kind == f.WINDOW_UPDATE and length == 4 and self._continuation is None:
                    # A client's one or two after every answer: read in place (``_frame`` takes a copy).
                    self._window_update(stream & 0x7FFF_FFFF, f.WORD.unpack_from(buffer, start)[0])
                else:
                    self._frame(kind, flags, stream & 0x7FFF_FFFF, bytes(buffer[start:position]))
                if self._closed:
                    return
        except FrameError as exc:
            self._starting.clear()
            self._fail(exc.code, str(exc))
            return
        finally:
            if self._starting:
                self._start_calls()
        del buffer[:position]
        if self._receive_window < CONNECTION_WINDOW // 2 and not self._closed:
            self.write(f.window_update(0, CONNECTION_WINDOW - self._receive_window))
            self._receive_window = CONNECTION_WINDOW

    def _start_calls(self) -> None:
        starting, self._starting = self._starting, []
        for call in starting:
            try:
                call.start_pending()
            except Exception:  # noqa: BLE001 - a bug: the call ends INTERNAL, the connection goes on
                log.exception("starting gRPC %s failed", call.request.path.decode("latin-1"))
                call.end(_INTERNAL_CODE, "internal error starting the call")

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    # Frames

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise FrameError(Error.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not payload and kind in (f.DATA, f.HEADERS, f.CONTINUATION) and not flags & (f.END_STREAM | f.END_HEADERS):
            self._floods.count(Flood.EMPTY, self.loop.time())
        if kind == f.DATA:
            self._data(flags, stream, payload)
        elif kind == f.HEADERS:
            self._headers(flags, stream, payload)
        elif kind == f.CONTINUATION:
            self._continued(flags, stream, payload)
        elif kind == f.WINDOW_UPDATE:
            if len(payload) != 4:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame is 4 bytes")
            self._window_update(stream, int.from_bytes(payload, "big"))
        elif kind == f.SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == f.PING:
            if len(payload) != 8 or stream:
                raise FrameError(Error.FRAME_SIZE_ERROR if len(payload) != 8 else Error.PROTOCOL_ERROR, "bad PING")
            if flags & f.ACK:
                self._ping_sent = None
            else:
                self._floods.count(Flood.PING, self.loop.time())
                self.write(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.RST_STREAM:
            if len(payload) != 4:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a RST_STREAM frame is 4 bytes")
            if stream == 0 or stream > self._last_stream:
                raise FrameError(Error.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream}")
            call = self._calls.get(stream)
            if call is not None:
                self._ended_by_client.add(stream)
                self.forget(call)
                call.reset()
                self._floods.count(Flood.RESET, self.loop.time())
        elif kind == f.GOAWAY:
            self._going_away = True  # the client opens no new streams; the open ones finish
        elif kind == f.PRIORITY:
            if not stream:
                raise FrameError(Error.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise FrameError(Error.FRAME_SIZE_ERROR, "a PRIORITY frame is 5 bytes")
            self._floods.count(Flood.PRIORITY, self.loop.time())
        elif kind == f.PUSH_PROMISE:
            raise FrameError(Error.PROTOCOL_ERROR, "a client cannot push")
        else:  # other frame types are ignored (RFC 9113 section 4.1), but counted
            self._floods.count(Flood.UNKNOWN, self.loop.time())

    def _data(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0:
            raise FrameError(Error.PROTOCOL_ERROR, "DATA on stream 0")
        counted = len(payload)
        self._receive_window -= counted
        if self._receive_window < 0:
            raise FrameError(Error.FLOW_CONTROL_ERROR, "the client sent past the connection's window")
        call = self._calls.get(stream)
        if call is None or stream in self._ended_by_client:
            self._on_closed(stream, "DATA")
            return  # a stream the server answered and reset: dropped
        data = f.unpadded(payload, flags)
        end = bool(flags & f.END_STREAM)
        if end:
            self._ended_by_client.add(stream)
        if stream in self._lengths and not self._count_length(call, len(data), end):
            return
        call.data(data, counted, end)

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
            self._continuations = 0

    def _continued(self, flags: int, stream: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream:
            raise FrameError(Error.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, first_flags, parts, size = self._continuation
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise FrameError(Error.ENHANCE_YOUR_CALM, f"a header block in more than {MAX_CONTINUATIONS} "
                                                      "CONTINUATION frames")
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
        if call is not None and stream not in self._ended_by_client:  # trailers: a request's stream ends
            if not flags & f.END_STREAM:
                raise FrameError(Error.PROTOCOL_ERROR, f"a second header block on stream {stream} without its end")
            self._ended_by_client.add(stream)
            if not request.trailer:
                self._reset_malformed(call, "trailers with a pseudo-header")
                return
            if stream in self._lengths and not self._count_length(call, 0, True):
                return
            call.remote_end()
            return
        if not stream % 2:
            raise FrameError(Error.PROTOCOL_ERROR, f"HEADERS opening stream {stream}: a client's streams are odd")
        if stream <= self._last_stream:
            self._on_closed(stream, "HEADERS")
            return  # trailers on a stream the server answered and reset: ignored (the table took the block)
        self._last_stream = stream
        if self._going_away or len(self._calls) >= self._server.config.max_streams_per_connection:
            self._floods.count(Flood.REFUSED, self.loop.time())
            self._remember(stream, False)
            self.write(f.rst_stream(stream, Error.REFUSED_STREAM))
            return
        if request.malformed is not None:
            log.debug("gRPC stream %d from %s: %s", stream, self.peer, request.malformed)
            self._remember(stream, False)
            self.write(f.rst_stream(stream, Error.PROTOCOL_ERROR))
            return
        if request.bad_timeout is not None:
            self._refuse(stream, _INVALID_ARGUMENT, f"grpc-timeout {request.bad_timeout.decode('latin-1')!r} is not 1 "
                                                    "to 8 digits and a unit (H, M, S, m, u or n)", flags)
            return
        receive = STREAM_WINDOW if self._settings_acked else f.DEFAULT_WINDOW
        call = Call(self, stream, request, receive, self._stream_send_window)
        self._calls[stream] = call
        self._busy_at = self.loop.time()
        if request.content_length is not None:
            self._lengths[stream] = [request.content_length, 0]
        if flags & f.END_STREAM:
            self._ended_by_client.add(stream)
            call.remote_ended = True
            if request.content_length:
                self._reset_malformed(call, "content-length above the bytes sent")
                return
        call.start(self._server.handler(request.path))

    def _refuse(self, stream: int, code: int, message: str, flags: int) -> None:
        """Answer a call with a status alone (a Trailers-Only response) before any handler runs."""
        out = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream, self.headers.trailers(code, message, (), False))
        if not flags & f.END_STREAM:
            out += f.rst_stream(stream, Error.NO_ERROR)
        self._remember(stream, bool(flags & f.END_STREAM))
        self.write(out)

    def _remember(self, stream: int, by_client: bool) -> None:
        self._closed_streams[stream] = by_client
        if len(self._closed_streams) > CLOSED_REMEMBERED:
            del self._closed_streams[next(iter(self._closed_streams))]

    def _on_closed(self, stream: int, kind: str) -> None:
        """A ``kind`` frame on ``stream``, which is not open (RFC 9113 section 5.1): an error unless the server
        reset it (what the client sent before it knew is dropped) or it is too old to tell."""
        if stream > self._last_stream:
            raise FrameError(Error.PROTOCOL_ERROR, f"{kind} on idle stream {stream}")
        if stream in self._ended_by_client or self._closed_streams.get(stream):
            raise FrameError(Error.STREAM_CLOSED, f"{kind} on stream {stream}, which the client closed")
        remembered = self._closed_streams
        if stream not in remembered and len(remembered) < CLOSED_REMEMBERED:
            raise FrameError(Error.PROTOCOL_ERROR, f"{kind} on stream {stream}, below the last stream opened "
                                                   f"({self._last_stream}) and never opened itself")

    def _count_length(self, call: Call, size: int, end: bool) -> bool:
        """Hold a stream's DATA to the content-length it declared; False when it broke it (then reset)."""
        declared = self._lengths[call.stream]
        declared[1] += size
        if declared[1] > declared[0] or (end and declared[1] != declared[0]):
            self._reset_malformed(call, "content-length does not match the DATA sent")
            return False
        return True

    def _reset_malformed(self, call: Call, reason: str) -> None:
        """A malformed request (RFC 9113 section 8.1.1): its stream is reset with PROTOCOL_ERROR."""
        log.debug("gRPC stream %d from %s: %s", call.stream, self.peer, reason)
        self.forget(call)
        call.reset()
        self.write(f.rst_stream(call.stream, Error.PROTOCOL_ERROR))

    def _window_update(self, stream: int, word: int) -> None:
        """A WINDOW_UPDATE frame on ``stream`` whose payload is ``word`` (its reserved bit not yet dropped)."""
        self._window_updates += 1
        if self._window_updates == WINDOW_UPDATE_BUNCH:
            self._window_updates = 0
            self._floods.count(Flood.WINDOW_UPDATE, self.loop.time(), WINDOW_UPDATE_BUNCH)
        increment = word & 0x7FFF_FFFF
        if stream == 0:
            if increment == 0:
                raise FrameError(Error.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise FrameError(Error.FLOW_CONTROL_ERROR, "the connection's window above 2^31-1")
            if self._waiting_window:  # (the common update, a client's after each answer, finds none waiting)
                waiting, self._waiting_window = self._waiting_window, set()
                for blocked in waiting:
                    blocked.window_opened()
            return
        call = self._calls.get(stream)
        if call is None:
            if stream > self._last_stream:
                raise FrameError(Error.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream}")
            return
        if increment == 0:
            self._reset_malformed(call, "a WINDOW_UPDATE of 0")
            return
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
        self._floods.count(Flood.SETTINGS, self.loop.time())
        values = f.parse_settings(payload)
        if f.HEADER_TABLE_SIZE in values:
            self.headers.resize(values[f.HEADER_TABLE_SIZE])  # before the ACK: blocks after it say so
        if f.INITIAL_WINDOW_SIZE in values and values[f.INITIAL_WINDOW_SIZE] != self._stream_send_window:
            # Only a change walks the open calls (a flood repeating one value costs one frame each).
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
        loopback costs more than the answers it carries), sent at the end of the turn or when the
        connection's last open call ends (``forget``)."""
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

    def start_after_read(self, call: Call) -> None:
        """Start ``call`` once this read's frames are all taken (its message may be among them)."""
        self._starting.append(call)

    def open_stream_window(self, stream: int, increment: int) -> None:
        self.write(f.window_update(stream, increment))

    def forget(self, call: Call) -> None:
        stream = call.stream
        if self._calls.get(stream) is call:
            del self._calls[stream]
            self._lengths.pop(stream, None)
            by_client = stream in self._ended_by_client
            self._ended_by_client.discard(stream)
            self._remember(stream, by_client)
            if not self._calls:
                self._busy_at = self.loop.time()
                # No other call can add to this turn's send: it goes now, not a loop turn later (a client
                # with one call at a time waits for it).
                self._flush()
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
        """Close once what is written is sent; a client that does not read it within ``CLOSE_GRACE``
        seconds is cut off (its unsent bytes would be held for as long as it waits)."""
        if not self._closed and self.transport is not None:
            self._flush()
            self._closed = True
            self.transport.close()
            self.loop.call_later(CLOSE_GRACE, self.transport.abort)

    def _arm(self, delay: float) -> None:
        self._timer = self.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        """The handshake and idle timeouts, and keepalive pings on connections with calls open."""
        if self._closed:
            return
        idle = self._server.config.idle_timeout
        now = self.loop.time()
        silent = now - self._heard
        if not self._preface or (not self._calls and now - self._busy_at >= idle):
            self._fail(Error.NO_ERROR, "idle")  # pings do not count: only calls keep a connection
            return
        if self._calls and self._ping_sent is not None and now - self._ping_sent >= KEEPALIVE_TIMEOUT:
            self._fail(Error.ENHANCE_YOUR_CALM, "no answer to a keepalive ping")
            return
        if self._calls and silent >= KEEPALIVE and self._ping_sent is None:
            self._ping_sent = now
            self.write(f.frame(f.PING, 0, 0, b"\x00" * 8))
        self._arm(min(idle, KEEPALIVE_TIMEOUT) / 2 if self._calls else max(0.05, idle - (now - self._busy_at)))

    def running(self) -> list[asyncio.Future]:
        """Its calls still running: their handlers' tasks, or for a call served without one what stands for
        it (what the server's stop waits for, then cancels)."""
        return [task for call in self._calls.values() if (task := call.running) is not None]
