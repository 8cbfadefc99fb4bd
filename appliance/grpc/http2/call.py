"""One gRPC call on an HTTP/2 stream: what its handler sees as its ``context`` (the metadata, the peer,
``read``, ``write``, ``abort``, the trailing metadata) and the stream's two directions under HTTP/2 flow
control. A handler is one of ``appliance.grpc.admission.AdmittingHandlers``'.

Receiving: a stream's window starts small (``STREAM_WINDOW``), so that a call not yet admitted holds at
most that of its client's bytes; only while the handler reads (after admission, and for a message larger
than what the window lets in, in a receive slot) is the window opened to the rest of the message, and a
message longer than ``max_message_bytes`` is refused (RESOURCE_EXHAUSTED) from its 5-byte prefix, before
its bytes come. ``announced`` tells the handler whether the next message needs its window opened (a
receive slot) once its prefix is in; ``meter`` holds its bytes to a minimum rate (``ReceiveRules``): a
client that stalls fails its call (DEADLINE_EXCEEDED) and gives its slot back. A compressed message is
handed over as sent (``appliance.protocol.inflate.Compressed``): the handler inflates it, off the event
loop and on its request's memory budget."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from appliance.core.errors import ApplianceError, InvalidInput, PayloadTooLarge, RequestTimeout
from appliance.grpc.grpc_config import ReceiveRules
from appliance.grpc.http2.frames import (
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    Error,
    FrameError,
    frame,
    rst_stream,
)
from appliance.grpc.http2.headers import HeaderEncoder, Request
from appliance.grpc.status import abort, status_of, unexpected
from appliance.protocol.inflate import Compressed

__all__ = ["Call", "STREAM_WINDOW"]


STREAM_WINDOW = 16 * 1024
"""A stream's receive window while no handler reads it."""
_OK = grpc.StatusCode.OK.value[0]
_DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]
_CODINGS = {b"gzip": "gzip", b"deflate": "deflate"}


class Channel(Protocol):
    """What a call needs of its connection (``appliance.grpc.http2.connection.Http2Connection``)."""

    loop: asyncio.AbstractEventLoop
    peer: str
    max_message: int
    send_window: int
    """What the client lets the server send on the connection now."""
    max_frame: int
    headers: HeaderEncoder
    """The connection's HPACK encoder: a block it encodes is written at once (HPACK state is per connection)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def wait_window(self, call: Call) -> None: ...

    def open_stream_window(self, stream: int, increment: int) -> None: ...

    def forget(self, call: Call) -> None: ...

    def start_after_read(self, call: Call) -> None: ...

    def hold(self, call: Call, size: int) -> bool: ...

    def release(self, size: int) -> None: ...


class _Requests:
    """The call's request messages (raw bytes) as the async iterator a streaming handler takes."""

    __slots__ = ("_call",)

    def __init__(self, call: Call) -> None:
        self._call = call

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> bytes:
        message = await self._call.read()
        if message is grpc.aio.EOF:
            raise StopAsyncIteration
        return message


class Call:
    # What a call starts with and most calls never change, as class attributes: an instance sets its own
    # only when it does (a call's __init__ runs for every request).
    _expect = 0
    """Bytes of the message being received still to come (0: none begun)."""
    _failure: BaseException | None = None
    _reader: asyncio.Future[None] | None = None
    _announcing: asyncio.Future[None] | None = None
    _received = 0
    """DATA bytes taken on this stream (what the meter measures)."""
    _meter: asyncio.TimerHandle | None = None
    _metered: tuple[ReceiveRules, float, int] | None = None
    """The rules, when the metered message began and the bytes taken by then."""
    _window: asyncio.Future[None] | None = None
    remote_ended = False
    local_ended = False
    _headers_sent = False
    _trailing: tuple[tuple[str, str], ...] = ()
    _serializer: Callable[[Any], bytes] | None = None
    _task: asyncio.Task | None = None
    _pending: grpc.RpcMethodHandler | None = None
    """A handler that may serve the call without a task (``straight``), until the read that brought the
    call's headers ends (``start_after_read``)."""
    _stop: Callable[[], object] | None = None
    """While the call is served without a task: what takes its request back."""
    _served: asyncio.Future[None] | None = None
    """Made only when the server stops meanwhile (``running``): resolved as the call ends."""
    _timer: asyncio.TimerHandle | None = None
    _expired = False
    unread = 0
    """Bytes received while no handler read them, counted on the connection's allowance."""

    def __init__(self, connection: Channel, stream: int, request: Request, receive_window: int,
                 send_window: int) -> None:
        self._connection = connection
        self.stream = stream
        self.request = request
        self.receive_window = receive_window
        self.send_window = send_window
        self._doubt = DEFAULT_WINDOW - STREAM_WINDOW if receive_window == DEFAULT_WINDOW else 0
        """A stream opened before the client acknowledged the server's SETTINGS starts with HTTP/2's default
        window, and the client shrinks it to ``STREAM_WINDOW`` once it applies them (RFC 9113 section
        6.9.2), unbeknown to the stream: the window is opened as if it had, else a client that sent the
        default window's worth first would wait for a window the server thinks it has."""
        self._buffer = bytearray()
        self._messages: collections.deque[bytes] = collections.deque()

    # The handler's context (what appliance.grpc reads of grpc.aio.ServicerContext)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.request.metadata

    def peer(self) -> str:
        return self._connection.peer

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._trailing = tuple(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.end(code.value[0], details)
        raise grpc.aio.AbortError()

    async def read(self) -> Any:
        """The next request message (bytes), or ``grpc.aio.EOF`` once the client ended its side."""
        if self.unread:  # what a reading handler holds is its own
            self._connection.release(self.unread)
            self.unread = 0
        while not self._messages:
            if self._failure is not None:
                self._unmeter()
                raise self._failure
            if self.remote_ended:
                self._unmeter()
                return grpc.aio.EOF
            self._open_window()
            self._reader = self._connection.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        if self._meter is not None:
            self._unmeter()
        return self._messages.popleft()

    async def announced(self, rules: ReceiveRules) -> bool:
        """Wait, under ``rules`` from now, until the next message is whole or its 5-byte prefix is in (or the
        client ended its side): True when the rest of it needs more window than the stream has (so a
        receive slot; the meter is then stopped until ``meter`` starts it again), False when ``read`` can
        have it as it is (the meter goes on until that read)."""
        while not self._messages:
            if self._failure is not None:
                self._unmeter()
                raise self._failure
            if self.remote_ended:
                return False
            if len(self._buffer) >= 5 and self._expect > self.receive_window - self._doubt:
                self._unmeter()
                return True
            if self._metered is None:
                self.meter(rules)
            if len(self._buffer) >= 5:
                return False  # the rest fits the window: read takes it, under the meter
            self._announcing = self._connection.loop.create_future()
            try:
                await self._announcing
            finally:
                self._announcing = None
        return False

    def meter(self, rules: ReceiveRules) -> None:
        """From now until the next message is read, its bytes must keep coming at ``rules.min_rate`` after
        ``rules.grace`` (and all of them within ``rules.timeout``): else the call fails (RequestTimeout)."""
        self._unmeter()
        now = self._connection.loop.time()
        self._metered = (rules, now, self._received)
        self._meter = self._connection.loop.call_at(rules.deadline(now, 0), self._check_rate)

    def _unmeter(self) -> None:
        self._metered = None
        if self._meter is not None:
            self._meter.cancel()
            self._meter = None

    def _check_rate(self) -> None:
        self._meter = None
        if self._metered is None or self._messages or self._failure is not None or self.remote_ended:
            return
        rules, started, before = self._metered
        received = self._received - before
        deadline = rules.deadline(started, received)
        now = self._connection.loop.time()
        if now < deadline:  # bytes came meanwhile: the next check is when they no longer keep up
            self._meter = self._connection.loop.call_at(deadline, self._check_rate)
            return
        self._metered = None
        if now >= started + rules.timeout:
            message = (f"the request message did not arrive within {rules.timeout:g} s; send it without pauses "
                       "(the server's body_timeout setting)")
        else:
            message = (f"the request message came at less than {rules.min_rate:g} bytes a second ({received} bytes "
                       f"in {now - started:.1f} s, past a grace of {rules.grace:g} s); send it without pauses (the "
                       "server's grpc_receive_min_rate setting)")
        self._fail(RequestTimeout(message))

    async def write(self, message: Any) -> None:
        assert self._serializer is not None
        await self._send_message(self._serializer(message))

    # Running the handler

    def start(self, handler: grpc.RpcMethodHandler | None) -> None:
        request = self.request
        if request.method != b"POST" or not request.content_type.startswith(b"application/grpc"):
            # Not gRPC: an HTTP status, as gRPC servers answer (415 for the content type).
            self._finish(frame(HEADERS, END_HEADERS | END_STREAM, self.stream,
                               self._connection.headers.response(405 if request.method != b"POST" else 415)))
            return
        if handler is None:
            self.end(_UNIMPLEMENTED, f"Method not found: {request.path.decode('latin-1')}")
            return
        if request.encoding not in (b"identity", *_CODINGS):
            self.end(_UNIMPLEMENTED, f"Compression algorithm '{request.encoding.decode('latin-1')}' is not "
                                     "supported; send identity, deflate or gzip")
            return
        loop = self._connection.loop
        if request.timeout is not None:
            self._timer = loop.call_later(request.timeout, self._expire)
        if getattr(handler, "straight", None) is not None:
            self._pending = handler
            self._connection.start_after_read(self)
            return
        self._task = loop.create_task(self._run(handler))

    def start_pending(self) -> None:
        """At the end of the read that brought the call's headers: a call whose one message came whole with
        them is served without a task where its handler can (``straight``); any other runs its task."""
        handler, self._pending = self._pending, None
        if handler is None or self.local_ended:
            return
        if (self.remote_ended and self._failure is None and len(self._messages) == 1
                and type(self._messages[0]) is bytes and handler.straight(self)):
            return
        self._task = self._connection.loop.create_task(self._run(handler))

    # Served without a task (``start_pending``): what the handler's ``straight`` uses

    def peek_message(self) -> bytes:
        """The call's one message, whole (``start_pending`` checked), left in place."""
        return self._messages[0]

    def take_message(self) -> bytes:
        """The call's one message, whole (``start_pending`` checked), off the connection's allowance."""
        if self.unread:
            self._connection.release(self.unread)
            self.unread = 0
        return self._messages.popleft()

    def serving(self, stop: Callable[[], object]) -> None:
        """The call's request is in progress; ``stop`` takes it back (the deadline, a reset, the server's
        stop): the handler then ends the call (``ended``) as its request's outcome says."""
        self._stop = stop

    def ended(self) -> None:
        """The call served without a task is over (answered, refused or taken back; an answer that waits
        for the client's window keeps the deadline, in its task)."""
        self._stop = None
        if self._timer is not None and self._task is None:
            self._timer.cancel()
            self._timer = None
        if self._served is not None and not self._served.done():
            self._served.set_result(None)

    def answer(self, payload: bytes) -> None:
        """The unary answer: headers, message and trailers in one write where the windows and a frame take
        them (as ``_send_message``), else from a task that waits for the window."""
        if self.local_ended:
            return
        if not self._sent_whole(payload, last=True):
            self._task = self._connection.loop.create_task(self._answer_later(payload))

    async def _answer_later(self, payload: bytes) -> None:
        try:
            await self._send_message(payload, last=True)
        except asyncio.CancelledError:
            self.taken_back()
        finally:
            if self._timer is not None:
                self._timer.cancel()

    def refuse(self, error: ApplianceError) -> None:
        """End the call with the error's status (``abort`` without a task)."""
        status = status_of(error)
        if status.trailing:
            self.set_trailing_metadata(status.trailing)
        self.end(status.code.value[0], status.message)

    def taken_back(self) -> None:
        """End a call whose request was taken back: DEADLINE_EXCEEDED at its deadline, else CANCELLED
        (nothing is sent after a reset)."""
        self.end(_DEADLINE if self._expired else _CANCELLED,
                 "Deadline Exceeded" if self._expired else "the call was cancelled")

    async def _run(self, handler: grpc.RpcMethodHandler) -> None:
        try:
            if handler.stream_unary is not None:
                answer = await handler.stream_unary(_Requests(self), self)
                await self._send_message(handler.response_serializer(answer), last=True)
            else:
                self._serializer = handler.response_serializer
                await handler.stream_stream(_Requests(self), self)
            self.end(_OK, "")
        except grpc.aio.AbortError:
            pass  # abort() ended the call with its status
        except ApplianceError as exc:  # what the transport itself refused (a message too large, say)
            with contextlib.suppress(grpc.aio.AbortError):
                await abort(self, exc)
        except asyncio.CancelledError:
            # The deadline passed, the server stops, or the client reset the stream (then nothing is sent).
            self.taken_back()
        except Exception as exc:  # noqa: BLE001 - a bug: INTERNAL, logged
            self.refuse(unexpected(self.request.path.decode("latin-1"), exc))
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._unmeter()

    def _expire(self) -> None:
        self._timer = None
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()
        elif self._stop is not None:
            self._expired = True
            self._stop()

    # Receiving

    def data(self, payload: bytes, counted: int, end: bool) -> None:
        """A DATA frame's ``payload`` (``counted``: its length with padding, what the window lost)."""
        self.receive_window -= counted
        if self.receive_window < 0:
            raise FrameError(Error.FLOW_CONTROL_ERROR, f"stream {self.stream} sent past its window")
        if self.remote_ended:
            raise FrameError(Error.STREAM_CLOSED, f"DATA on stream {self.stream} after its end")
        if self.local_ended or self._failure is not None:
            pass  # answered (or refused) already: what still comes is dropped
        else:
            if self._reader is None:  # held for a handler that does not read (yet): the connection counts it
                self.unread += len(payload)
                if not self._connection.hold(self, len(payload)):
                    return  # over the connection's allowance: this stream was refused
            self._received += len(payload)
            if not self._buffer and self._whole(payload):
                pass
            else:
                self._buffer += payload
                self._take_messages()
        if end:
            self.remote_end()
        elif self._reader is not None and self._failure is None:
            self._open_window()
        elif self._announcing is not None and not self._announcing.done():
            self._announcing.set_result(None)  # the prefix may be in: announced looks again

    def _whole(self, payload: bytes) -> bool:
        """The common case: the frame holds exactly one message."""
        if (len(payload) < 5 or int.from_bytes(payload[1:5], "big") != len(payload) - 5
                or len(payload) - 5 > self._connection.max_message):  # refused by _take_messages
            return False
        self._message(payload[0], memoryview(payload)[5:])
        return True

    def _take_messages(self) -> None:
        buffer = self._buffer
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if length > self._connection.max_message:
                self._fail(PayloadTooLarge(
                    f"the message is {length} bytes, above the largest this server takes "
                    f"({self._connection.max_message}, the max_request_bytes setting); send less at once"))
                buffer.clear()
                return
            if len(buffer) < 5 + length:
                self._expect = 5 + length - len(buffer)
                return
            flag = buffer[0]
            message = memoryview(buffer)[5:5 + length]
            try:
                self._message(flag, message)
            finally:
                message.release()  # the buffer can be cut once no view of it is left
            del buffer[:5 + length]
            if self._failure is not None:
                buffer.clear()
                return
        self._expect = 0

    def _message(self, flag: int, data: memoryview) -> None:
        """One message (its bytes copied out of ``data``); a compressed one as sent, for the handler to
        inflate on its request's budget (inflating here would be on the event loop, and uncounted)."""
        message: bytes
        if flag:
            coding = _CODINGS.get(self.request.encoding)
            if coding is None:
                self._fail(InvalidInput("a compressed message without a grpc-encoding to read it with; send "
                                        "grpc-encoding: gzip or deflate"))
                return
            message = Compressed(data, coding)
        else:
            message = bytes(data)
        self._messages.append(message)
        if self._reader is not None or self._announcing is not None:
            self._wake()

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        self._messages.clear()
        self._wake()

    def remote_end(self) -> None:
        self.remote_ended = True
        if self._buffer and self._failure is None:
            self._fail(InvalidInput("the stream ended inside a message; send whole messages"))
        self._wake()
        if self.local_ended:
            self._connection.forget(self)

    def _wake(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)
        if self._announcing is not None and not self._announcing.done():
            self._announcing.set_result(None)

    def _open_window(self) -> None:
        """A handler reads: the client may send the rest of the message being received, or a small one."""
        wanted = max(STREAM_WINDOW, self._expect)
        assured = self.receive_window - self._doubt
        if wanted > assured and not self.remote_ended:
            increment = wanted - assured
            self.receive_window += increment
            self._connection.open_stream_window(self.stream, increment)

    # Sending

    def window_opened(self) -> None:
        if self._window is not None and not self._window.done():
            self._window.set_result(None)

    def reset(self) -> None:
        """The client reset the stream (or the connection went): the handler is cancelled, nothing is sent."""
        self.remote_ended = self.local_ended = True
        self._fail(asyncio.CancelledError())
        self.window_opened()
        self._pending = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        elif self._stop is not None:
            self._stop()

    async def _send_message(self, payload: bytes, last: bool = False) -> None:
        if self.local_ended:  # reset or ended meanwhile: nothing more is sent (nor a header block encoded)
            raise asyncio.CancelledError()
        connection = self._connection
        if self._sent_whole(payload, last):
            await connection.drain()
            return
        if not self._headers_sent:
            connection.write(frame(HEADERS, END_HEADERS, self.stream, connection.headers.response()))
            self._headers_sent = True
        prefix = b"\x00" + len(payload).to_bytes(4, "big")
        # Frame by frame from the message itself: a large one is never copied whole on the event loop (its
        # prefix goes in a frame of its own).
        for part in (prefix, payload):
            view = memoryview(part)
            while view:
                if self.local_ended:
                    raise asyncio.CancelledError()
                allowed = min(len(view), self.send_window, connection.send_window, connection.max_frame)
                if allowed <= 0:
                    await self._window_opened()
                    continue
                self.send_window -= allowed
                connection.send_window -= allowed
                connection.write(frame(DATA, 0, self.stream, bytes(view[:allowed])))
                view = view[allowed:]
                await connection.drain()  # what one turn of the loop writes is bounded by the transport's buffer

    def _sent_whole(self, payload: bytes, last: bool) -> bool:
        """Send the message in one write (after the headers, the first time; a unary answer's ``last`` one
        with the trailers too) where both windows and a frame take it; False, nothing sent, where not."""
        connection = self._connection
        size = 5 + len(payload)
        if size > self.send_window or size > connection.send_window or size > connection.max_frame:
            return False
        self.send_window -= size
        connection.send_window -= size
        out = frame(DATA, 0, self.stream, b"\x00" + len(payload).to_bytes(4, "big") + payload)
        if not self._headers_sent:
            out = frame(HEADERS, END_HEADERS, self.stream, connection.headers.response()) + out
            self._headers_sent = True
        if last:
            self.end(_OK, "", out)
        else:
            connection.write(out)
        return True

    async def _window_opened(self) -> None:
        self._window = self._connection.loop.create_future()
        self._connection.wait_window(self)
        try:
            await self._window
        finally:
            self._window = None

    def end(self, code: int, message: str, before: bytes = b"") -> None:
        """Send the call's status (in trailers, or a Trailers-Only response), after ``before``; the stream
        is reset if the client still sends."""
        if self.local_ended:
            return
        block = self._connection.headers.trailers(code, message, self._trailing, self._headers_sent)
        self._headers_sent = True
        self._finish(before + frame(HEADERS, END_HEADERS | END_STREAM, self.stream, block))

    def _finish(self, out: bytes) -> None:
        """Send ``out``, which ends the stream on this side; reset it if the client still sends."""
        self.local_ended = True
        if not self.remote_ended:
            out += rst_stream(self.stream, Error.NO_ERROR)  # the answer is complete: stop sending
            self.remote_ended = True
        self._connection.write(out)
        self._connection.forget(self)

    @property
    def running(self) -> asyncio.Future | None:
        """The handler's task while it runs; for a call served without one, a future that resolves as it
        ends (cancelling it takes the request back)."""
        task = self._task
        if task is not None and not task.done():
            return task
        if self._stop is None:
            return None
        if self._served is None:
            self._served = self._connection.loop.create_future()
            self._served.add_done_callback(self._stop_served)
        return self._served

    def _stop_served(self, served: asyncio.Future[None]) -> None:
        if served.cancelled() and self._stop is not None:  # the server's stop gave up waiting
            self._stop()
