"""The infer lane's connections: what one HTTP port's lane keeps (``LaneConnections``: its open
connections, timeouts and stop) and the protocol of one connection (``LaneConnection``), apart from what
answers the lane's requests through the data plane (``appliance.rest.lane.InferLane``, the one subclass:
the split keeps the connection's state machine out of the answering, and the two modules free of a
cycle). The rules the connections keep (heads, bodies, timeouts, pipelining, hand-over) are told in
``appliance.rest.lane``."""

from __future__ import annotations

import asyncio
import functools
import logging
import typing
from collections.abc import Awaitable, Callable

from appliance.protocol.drain import finish_by
from appliance.rest.http_basics import body_timeout, transport_address
from appliance.rest.lane_head import LANE_HEAD_BYTES, HeadReader, HeadRefused
from appliance.rest.lane_known import KnownHead
from appliance.rest.lane_wire import LANE_BODY_BYTES, LaneHead, closing, error_response, lane_request

__all__ = ["LaneConnection", "LaneConnections", "Running"]

log = logging.getLogger(__name__)

_PAUSE_BYTES = LANE_HEAD_BYTES + LANE_BODY_BYTES  # pipelined bytes held while a request runs
_LINGER = 1.0  # after refusing a head: how long what the client still sends is read and dropped


class Running(asyncio.Future):
    """A request the lane serves without a task (``LaneConnections.serve``), in progress: done once it is
    answered; cancelling it (the client went away, the stop deadline passed) takes the request back.
    ``withdraw``: how, once the lane has set it (a slot: no dict a request)."""

    __slots__ = ("withdraw",)
    withdraw: Callable[[], object] | None

    def cancel(self, msg: object = None) -> bool:
        if self.done():
            return False
        withdraw = getattr(self, "withdraw", None)  # (unset: nothing to take back)
        self.withdraw = None
        try:
            if withdraw is not None:
                withdraw()
        finally:
            cancelled = super().cancel(msg)
        return cancelled


class LaneConnections:
    """What one port's lane keeps: its connections (``protocol`` makes one per accepted socket), the
    timeouts and body bound they keep, and their stop. ``InferLane`` answers the requests (``answer``)."""

    def __init__(self, header_timeout: float, body_timeout: float, max_body: int) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_body = min(LANE_BODY_BYTES, max_body)
        self.connections: set[LaneConnection] = set()
        self.stopping = False

    def protocol(self, fallback: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory whose connections hand over to ``fallback``'s protocol (aiohttp's)."""
        return lambda: LaneConnection(self, fallback)

    async def answer(self, head: LaneHead, body: Callable[[], Awaitable[bytes]], peer: str | None,
                     local: str | None) -> tuple[list[bytes], bool]:
        """The answer to one lane request whose head is in (``body`` waits for its body), and whether the
        connection must close after it."""
        raise NotImplementedError

    def serve(self, head: LaneHead, body: bytes, peer: str | None, local: str | None, running: Running,
              answered: Callable[[list[bytes], bool], None]) -> None:
        """``answer`` for a request whose body is in hand, without a task: ``answered(reply, close)`` once
        the answer is ready (in this step or a later one); ``running`` stands for it meanwhile."""
        raise NotImplementedError

    async def stop(self, deadline: float) -> None:
        """Close idle connections, give requests in progress until ``deadline`` (``time.monotonic()``),
        then cancel what is left; connections close after their answer."""
        self.stopping = True
        busy = []
        for connection in list(self.connections):
            if connection.running is None:
                connection.close()
            else:
                busy.append(connection.running)
        await finish_by(deadline, busy)
        for connection in list(self.connections):
            connection.close()


class LaneConnection(asyncio.Protocol):
    """One connection: on the lane until its first request that is not a lane request, aiohttp's after.
    A request starts (and is admitted) once its head is in; its body is handed to it when complete."""

    __slots__ = ("_lane", "_fallback", "_loop", "_transport", "_handed", "_buffer", "running", "_peer", "_local",
                 "_deadline", "_timer", "_reading_paused", "_drained", "_wanted", "_body", "_arrived", "_skip",
                 "_reader", "_refused", "_advancing", "_known")

    def __init__(self, lane: LaneConnections, fallback: Callable[[], asyncio.Protocol]) -> None:
        self._lane = lane
        self._fallback = fallback
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._handed: asyncio.Protocol | None = None
        self._buffer = bytearray()
        self.running: asyncio.Future | None = None
        """The request being served, if any."""
        self._peer: str | None = None
        self._local: str | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self._drained: asyncio.Future | None = None
        self._wanted = 0  # the running request's body length, while its body is still coming
        self._body: bytes | None = None  # the running request's body, once complete and not yet read
        self._arrived: asyncio.Future[bytes] | None = None  # what the running request waits on for its body
        self._skip = 0  # bytes of an answered request's body still to come, dropped
        self._reader: HeadReader | None = None  # the next request's head, while it comes in
        self._refused = False  # a head broke a rule: answered, and nothing more is taken
        self._advancing = False  # in _advance: an answer given within it leaves the next request to it
        self._known: KnownHead | None = None  # the last lane head read

    @property
    def buffered(self) -> int:
        """The bytes received and held (the head coming in, a body, pipelined requests): at most a head and
        a body beyond what one read of the socket brings, as reading pauses past that."""
        return len(self._buffer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's is not a subclass of asyncio.Transport, hence no isinstance.
        self._transport = typing.cast(asyncio.Transport, transport)
        self._peer = transport_address(transport, "peername")
        self._local = transport_address(transport, "sockname")
        self._lane.connections.add(self)
        self._deadline = self._loop.time() + self._lane.header_timeout
        self._timer = self._loop.call_at(self._deadline, self._expire)

    def data_received(self, data: bytes) -> None:
        if self._handed is not None:
            self._handed.data_received(data)
            return
        if self._refused:
            return
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        known = self._known
        if known is not None and self.running is None and not self._buffer and self._reader is None:
            # One whole request in one read, its head the last one's (the common keep-alive client): started
            # from the read itself, with no buffer between.
            taken = known.next_head(data)
            if taken is not None and len(data) == taken[0] + taken[1].length:
                self._begin(taken[1], data[taken[0]:])
                return
        self._buffer += data
        if self._wanted:  # the next piece of a body: its wait starts again
            self._deadline = self._loop.time() + self._lane.body_timeout
            if len(self._buffer) >= self._wanted:
                self._deliver()
        elif self.running is not None:
            if not self._reading_paused and len(self._buffer) > _PAUSE_BYTES:
                self._pause_reading()
        elif self._buffer:
            self._advance()

    def eof_received(self) -> bool | None:
        if self._handed is not None:
            return self._handed.eof_received()
        return None  # the transport closes, which cancels a request in progress (as aiohttp does)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handed is not None:
            self._handed.connection_lost(exc)
            return
        self._lane.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.running is not None:
            self.running.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.cancel()

    def pause_writing(self) -> None:
        if self._handed is not None:
            self._handed.pause_writing()
        elif self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._handed is not None:
            self._handed.resume_writing()
        elif self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _advance(self) -> None:
        """Take the requests that have come in, one at a time: read the next one's head as it comes; start
        the request once it is in, hand over at a request the lane does not take, refuse a head that
        breaks a rule. A request answered at once (refused, a read, an error) lets the next one start in
        this loop rather than deeper in the stack."""
        if self._advancing:
            return
        self._advancing = True
        try:
            while self.running is None and self._buffer and self._start_next():
                pass
        finally:
            self._advancing = False

    def _read_head(self) -> LaneHead | None:
        """The next request's head, taken off the buffer, once it is in and it is the lane's; None while it
        is coming, or once it is refused or handed over with the connection."""
        reader = self._reader
        if reader is None:
            reader = self._reader = HeadReader()
        buffer = self._buffer
        try:
            end = reader.feed(buffer)
        except HeadRefused as refusal:
            self._refuse(refusal)
            return None
        if not end:
            return None
        self._reader = None
        head = lane_request(reader, self._lane.max_body)
        if head is None:
            if reader.chunked_with_length:  # never the lane's (it is chunked): aiohttp reads it as RFC 9112 says
                buffer[:end] = reader.normalised(bytes(buffer[:end]))
            self._hand_over()
            return None
        raw = bytes(buffer[:end])
        del buffer[:end]
        if raw[:1] not in (b"\r", b"\n"):  # (a head after blank lines is read afresh)
            self._known = KnownHead(raw, head, self._lane.max_body)
        return head

    def _start_next(self) -> bool:
        """Start the next request, if its head is in; whether the connection is still the lane's to read."""
        buffer = self._buffer
        known = self._known
        head: LaneHead | None
        taken = known.next_head(buffer) if known is not None and self._reader is None else None
        if taken is not None:
            # The head the last request sent (clients repeat theirs), but for its lengths: read as it was.
            end, head = taken
            del buffer[:end]
        else:
            head = self._read_head()
            if head is None:
                return False
        length = head.length
        if len(buffer) >= length:  # the body came with its head: the straight line
            body = bytes(buffer[:length])
            del buffer[:length]
            self._begin(head, body)
        else:
            self._wanted = length
            self.running = self._loop.create_task(self._serve(head))
            self._arm(self._loop.time() + self._lane.body_timeout)
        if not self._reading_paused and len(buffer) > _PAUSE_BYTES:
            self._pause_reading()
        return True

    def _begin(self, head: LaneHead, body: bytes) -> None:
        """A request whose body is in hand, on the straight line (``LaneConnections.serve``)."""
        running = self.running = Running(loop=self._loop)
        self._lane.serve(head, body, self._peer, self._local, running,
                         functools.partial(self._answered, running, head))

    def _deliver(self) -> None:
        """The running request's body is complete."""
        wanted, self._wanted = self._wanted, 0
        body = bytes(self._buffer[:wanted])
        del self._buffer[:wanted]
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(body)
        else:
            self._body = body

    async def _read_body(self) -> bytes:
        """The running request's body, once it is complete (RequestTimeout: a piece came too late)."""
        if self._body is not None:
            body, self._body = self._body, None
            return body
        if self._arrived is None:  # (not None: a piece came too late, and the error waits here)
            self._arrived = self._loop.create_future()
        return await self._arrived

    async def _serve(self, head: LaneHead) -> None:
        """A request whose body is still coming: served by a task, which waits for it."""
        lane = self._lane
        reply, close = await lane.answer(head, self._read_body, self._peer, self._local)
        if self._wanted:  # answered before its body was in (refused, unknown model): drop the rest of it
            self._skip = self._wanted - len(self._buffer)
            del self._buffer[:self._wanted]
            self._wanted = 0
        self._body = None
        if self._arrived is not None:
            if self._arrived.done() and not self._arrived.cancelled():
                self._arrived.exception()  # retrieved: a timeout nobody waited for is no error to log
            self._arrived.cancel()
            self._arrived = None
        self._write(head, reply, close)

    def _answered(self, running: Running, head: LaneHead, reply: list[bytes], close: bool) -> None:
        """A request served without a task has its answer."""
        if running.done():  # withdrawn (its connection went, or the stop cut it)
            return
        # What withdraws it (the flight, whose answer leads back here) goes: else the request's objects
        # stay a reference cycle that only the garbage collector frees, ~11 objects a request.
        running.withdraw = None
        running.set_result(None)
        self._write(head, reply, close)

    def _write(self, head: LaneHead, reply: list[bytes], close: bool) -> None:
        """Write a request's answer; unless the connection closes after it, the next request goes on once
        the client has taken it (``_next``)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if close or head.close or self._lane.stopping:
            transport.writelines(closing(reply))
            transport.close()
            return
        if len(reply) == 1:
            transport.write(reply[0])
        else:
            transport.writelines(reply)
        drained = self._drained
        if drained is not None and not drained.done():
            drained.add_done_callback(lambda _: self._next())
        else:
            self._next()

    def _next(self) -> None:
        """After an answer (once the client has taken it, where writing paused): the wait for the next head
        starts, reading resumes, and a request already in goes on."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._deadline = self._loop.time() + self._lane.header_timeout
        self.running = None
        if self._reading_paused and len(self._buffer) <= _PAUSE_BYTES:  # else the next request drains first
            self._reading_paused = False
            transport.resume_reading()
        if self._buffer:
            self._advance()

    def _hand_over(self) -> None:
        """From now on this connection is aiohttp's, from the first byte of the request at hand."""
        self._reader = None
        handed = self._handed = self._fallback()
        self._lane.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self._transport is not None
        handed.connection_made(self._transport)
        if self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
        pending, self._buffer = bytes(self._buffer), bytearray()
        if pending:
            handed.data_received(pending)

    def _refuse(self, refusal: HeadRefused) -> None:
        """Answer a head that broke a rule and take nothing more; close once the client has had the answer
        (what it still sends meanwhile is read and dropped, so that no reset loses the answer)."""
        log.debug("refused a request head from %s: %d %s", self._peer, refusal.status, refusal.message)
        self._reader = None
        self._refused = True
        self._buffer = bytearray()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self._transport
        assert transport is not None
        if self._reading_paused:  # read on, and drop
            self._reading_paused = False
            transport.resume_reading()
        transport.writelines(closing(error_response(refusal.status, refusal.message)))
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the client reads the answer, then the end; its own end closes the connection
        self._timer = self._loop.call_later(_LINGER, transport.close)

    def _pause_reading(self) -> None:
        assert self._transport is not None
        self._reading_paused = True
        self._transport.pause_reading()

    def _arm(self, deadline: float) -> None:
        """Set the connection's deadline; the timer fires at it even where it comes sooner than the one it
        was set for (a body's wait, shorter than what was left of the wait for its head)."""
        self._deadline = deadline
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """The connection's timer: a head that has not come in time ends the connection; a body piece
        that has not, its request (408, and the connection closes after the answer)."""
        self._timer = None
        transport = self._transport
        if self._handed is not None or transport is None or transport.is_closing():
            return
        now = self._loop.time()
        if now < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._expire)
        elif self._wanted:
            timeout = body_timeout(self._lane.body_timeout, len(self._buffer))
            if self._arrived is not None and not self._arrived.done():
                self._arrived.set_exception(timeout)
            else:  # the request has not asked for its body yet: it gets the error when it does
                self._arrived = self._loop.create_future()
                self._arrived.set_exception(timeout)
            self._wanted = 0
        elif self.running is not None:  # the wait for the next head starts after the answer
            self._timer = self._loop.call_at(now + self._lane.header_timeout, self._expire)
        else:
            transport.close()

