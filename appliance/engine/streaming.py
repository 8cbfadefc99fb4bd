"""The responses of one request to a decoupled model: from the backend's threads to the event loop.

A decoupled model sends zero, one or many responses per request, from any thread, during or after
``run_requests``; the last carries the final flag. ``ResponseChannel`` is the ``ResponseSink`` the
scheduler hands the backend for such a request, and the event-loop side reads it in order.

Memory is bounded by backpressure, not by dropping: while the responses a consumer has not read yet
reach ``StreamLimits.max_responses`` or ``max_bytes``, or the daemon's request memory budget is spent
(they count against the request's account), ``send`` blocks the model's thread: a model that
produces faster than its client reads is slowed to the client's pace (Triton queues such responses
without bound). A consumer that reads nothing for
``stall_timeout`` seconds while the model waits fails the request ("the client stopped reading") and
cancels it, so a stuck client cannot hold a model thread forever. ``send`` is never called on the event
loop's thread by a backend; if it is, it cannot block there, and a full channel fails the request.
A producer on the event loop calls ``put`` instead (an ensemble streaming its responses), which waits
for room the same way without blocking the loop, or ``offer`` (a model process's channel read on the
loop), which queues the response at once when it fits and otherwise hands back the wait for room, so
that its caller holds back what follows (it stops reading the channel) until the response is queued.

Once the consumer goes away (``cancel``), ``cancelled()`` turns True (Triton's
``request.is_cancelled()``) and every later response is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import numpy as np

from appliance.core.errors import ApplianceError, InferenceFailed, Unavailable
from appliance.engine.tensor_checks import BYTES_ELEMENT_OVERHEAD
from appliance.engine.types import InferResponse

__all__ = [
    "OneResponse",
    "RawResponse",
    "ResponseChannel",
    "ResponseStream",
    "Responses",
    "StreamItem",
    "StreamLimits",
    "as_appliance_error",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    """How far a model may run ahead of the client reading its responses."""

    max_responses: int = 64
    """Responses sent but not yet read before ``send`` blocks."""
    max_bytes: int = 64 << 20
    """Output bytes sent but not yet read before ``send`` blocks (one larger response still passes when
    nothing else is pending)."""
    stall_timeout: float = 60.0
    """Seconds ``send`` waits for the consumer to read before the request fails as stalled."""
    deadline: float = 0.0
    """Seconds from the request's arrival to its final response; 0: none (as in Triton). Past it the
    request is cancelled (the model sees ``is_cancelled()``), what the model sends later is dropped, and
    the stream ends with ``DeadlineExceeded``: a model that never sends its final flag cannot hold a
    request (its memory, its place in ``max_concurrent_requests``, a caller waiting) for ever."""


@dataclasses.dataclass(slots=True)
class RawResponse:
    """One response as the backend sent it (outputs not yet post-processed), or the end of the stream."""

    outputs: Mapping[str, np.ndarray] | None
    error: ApplianceError | None
    parameters: Mapping[str, Any] | None
    final: bool
    size: int = 0
    """Bytes it holds, counted against ``StreamLimits.max_bytes``."""


def _ignore(size: int) -> None:
    pass


def _nbytes(outputs: Mapping[str, np.ndarray] | None) -> int:
    total = 0
    for value in (outputs or {}).values():
        array = np.asarray(value)
        if array.dtype == object:
            total += sum(len(item) if isinstance(item, (bytes, str)) else 0 for item in array.ravel())
            total += array.size * BYTES_ELEMENT_OVERHEAD
        else:
            total += array.nbytes
    return total


def as_appliance_error(error: BaseException, label: str) -> ApplianceError:
    """The error a client sees for what a backend raised or sent."""
    if isinstance(error, ApplianceError):
        return error
    return InferenceFailed(f"model {label} failed: {type(error).__name__}: {error}")


class ResponseChannel:
    """One decoupled request's responses: ``send`` from any thread, ``receive`` on the event loop."""

    def __init__(self, label: str, loop: asyncio.AbstractEventLoop, limits: StreamLimits = StreamLimits(),
                 reserve: Callable[[int], None] = _ignore, release: Callable[[int], None] = _ignore) -> None:
        """``reserve``/``release``: the request's memory account (thread-safe), which the responses held
        here count against; ``reserve`` raises when the box's request memory is exhausted."""
        self._label = label
        self._reserve = reserve
        self._release = release
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._limits = limits
        self._lock = threading.Condition()
        self._items: collections.deque[RawResponse] = collections.deque()
        self._bytes = 0
        self._ended = False
        """The final response (or a failure) is queued: nothing more is accepted."""
        self._cancelled = False
        self._warned = False
        """A response after the final one was logged."""
        self._waiter: asyncio.Future | None = None
        self._room: asyncio.Future | None = None
        """Set while ``put`` (or ``offer``'s wait) waits for the consumer to make room (woken by ``receive``,
        ``cancel`` and ``fail``)."""

    @property
    def limits(self) -> StreamLimits:
        return self._limits

    @property
    def account(self) -> tuple[Callable[[int], None], Callable[[int], None]]:
        """(reserve, release) of the request's memory account, for streams opened on its behalf."""
        return self._reserve, self._release

    # -- the backend side (any thread) ------------------------------------------------------------

    def cancelled(self) -> bool:
        """True once the consumer went away or the request failed (the model may stop early)."""
        return self._cancelled

    def send(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
             parameters: Mapping[str, object] | None = None, final: bool = False) -> None:
        """Queue one response (see ``appliance.backends.base.ResponseSink``); blocks while the consumer
        is behind (module docstring). Responses after the final one, or after cancellation, are dropped."""
        item = self._item(outputs, error, parameters, final)
        with self._lock:
            if self._closed_to_producer():
                return
            if not self._wait_for_room(item.size):
                return
            self._push(item)

    def offer(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
              parameters: Mapping[str, object] | None = None, final: bool = False) -> Awaitable[bool] | None:
        """``send`` for a producer on the event loop that must not wait inline: None once the response is
        queued (or dropped: after the final one or cancellation, or when the memory budget fails the
        request); when the consumer is behind, the wait for room as ``put`` waits (the response is queued
        when it completes, or the request fails as stalled). Send nothing more of this producer's
        until it completes: the responses must stay in order."""
        item = self._item(outputs, error, parameters, final)
        with self._lock:
            if self._closed_to_producer() or self._try_push(item) is not None:
                return None
        return self._put(item)

    def _item(self, outputs: Mapping[str, np.ndarray] | None, error: BaseException | None,
              parameters: Mapping[str, object] | None, final: bool) -> RawResponse:
        return RawResponse(dict(outputs) if outputs else None,
                           as_appliance_error(error, self._label) if error is not None else None,
                           dict(parameters) if parameters else None, final, _nbytes(outputs))

    def _closed_to_producer(self) -> bool:
        """Under the lock: True when a response now would be dropped (after the final one, or cancelled)."""
        if self._ended and not self._cancelled and not self._warned:
            self._warned = True  # once a request: a model may send thousands
            log.warning("model %s sent a response after its final one; dropped (this request's later ones too)",
                        self._label)
        return self._ended or self._cancelled

    def _try_push(self, item: RawResponse) -> bool | None:
        """Under the lock: True once ``item`` is queued; False when it is dropped (the request has ended,
        was cancelled, or fails now: the memory budget); None while the consumer is behind."""
        if self._ended or self._cancelled:
            return False
        try:
            fits = self._fits(item.size)
        except ApplianceError as exc:
            self._fail_locked(exc)
            return False
        if not fits:
            return None
        self._push(item)
        return True

    def _fits(self, size: int) -> bool:
        """Under the lock: whether ``size`` more bytes may be held now, reserving them if so. With nothing
        pending, a response always fits this stream; the memory account may still refuse it, which
        fails the request (nothing pending means no read of this stream can make room)."""
        limits = self._limits
        if self._items and (len(self._items) >= limits.max_responses or self._bytes + size > limits.max_bytes):
            return False
        try:
            self._reserve(size)
        except ApplianceError:
            if not self._items:
                raise
            return False  # the box's request memory is short: wait for this stream's reader to free some
        return True

    def _wait_for_room(self, size: int) -> bool:
        """Under the lock: wait until ``size`` more bytes fit; False when the request failed meanwhile."""
        limits = self._limits
        deadline: float | None = None
        while True:
            try:
                if self._fits(size):
                    return True
            except ApplianceError as exc:
                self._fail_locked(exc)
                return False
            if threading.get_ident() == self._loop_thread:
                self._fail_locked(Unavailable(
                    f"model {self._label} sent more responses than the client has read "
                    f"({len(self._items)} pending) from the event loop's thread, where it cannot wait"))
                return False
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + limits.stall_timeout
            if now >= deadline:
                self._fail_locked(self._stalled())
                return False
            self._lock.wait(deadline - now)
            if self._ended or self._cancelled:
                return False

    def _stalled(self) -> Unavailable:
        return Unavailable(f"the client read none of the {len(self._items)} pending responses of model {self._label} "
                           f"for {self._limits.stall_timeout:g} s; the request was cancelled (read the stream faster)")

    async def put(
        self,
        outputs: Mapping[str, np.ndarray] | None = None,
        *,
        parameters: Mapping[str, object] | None = None,
        final: bool = False,
    ) -> bool:
        """``send`` for a producer on the event loop: waits (without blocking the loop) while the consumer
        is behind, and fails the request as stalled after ``stall_timeout`` as ``send`` does. False once
        the request has been cancelled or failed: the producer should stop."""
        return await self._put(self._item(outputs, None, parameters, final))

    async def _put(self, item: RawResponse) -> bool:
        deadline: float | None = None
        while True:
            with self._lock:
                pushed = self._try_push(item)
                if pushed is not None:
                    return pushed
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self._limits.stall_timeout
                if now >= deadline:
                    self._fail_locked(self._stalled())
                    return False
                room = self._room = self._loop.create_future()
            try:
                await asyncio.wait_for(room, deadline - now)
            except TimeoutError:
                pass  # judged at the top of the loop

    def _push(self, item: RawResponse) -> None:
        self._items.append(item)
        self._bytes += item.size
        if item.final:
            self._ended = True
        waiter, self._waiter = self._waiter, None
        self._wake_from_any_thread(waiter)

    def _drop_pending(self) -> None:
        self._items.clear()
        self._release(self._bytes)
        self._bytes = 0

    def _fail_locked(self, error: ApplianceError) -> None:
        self._cancelled = True  # the model may stop: nobody will read what it sends
        self._drop_pending()
        self._push(RawResponse(None, error, None, True))
        self._lock.notify_all()
        self._wake_producer()

    def _wake_producer(self) -> None:
        """Under the lock: wake ``put`` (on the event loop), if it waits for room."""
        room, self._room = self._room, None
        self._wake_from_any_thread(room)

    def _wake_from_any_thread(self, waiter: asyncio.Future | None) -> None:
        """Wake ``waiter`` (a future of the event loop) now on the loop's thread, else through the loop."""
        if waiter is None:
            return
        if threading.get_ident() == self._loop_thread:
            _wake(waiter)
        else:
            self._loop.call_soon_threadsafe(_wake, waiter)

    # -- the event-loop side ----------------------------------------------------------------------

    @property
    def label(self) -> str:
        return self._label

    @property
    def ended(self) -> bool:
        return self._ended

    def expire(self, error: ApplianceError) -> None:
        """The request's deadline passed (any thread): unless it has ended, it is cancelled, what is
        pending is dropped and the stream ends with ``error``."""
        with self._lock:
            if not self._ended:
                self._fail_locked(error)

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error`` unless it has ended already (the request failed to run, its model
        is unloaded, or its producer is gone), past the limits: never blocks, from any thread. What was
        sent before still reaches the consumer; the model sees the request cancelled, and a send waiting
        for room returns at once (what it sends is dropped)."""
        with self._lock:
            if not self._ended:
                self._push(RawResponse(None, as_appliance_error(error, self._label), None, True))
            self._cancelled = True
            self._lock.notify_all()
            self._wake_producer()

    def cancel(self) -> None:
        """The consumer went away: the model sees ``cancelled()``, pending and later responses are dropped."""
        with self._lock:
            self._cancelled = True
            self._drop_pending()
            self._lock.notify_all()
            self._wake_producer()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    async def receive(self) -> RawResponse | None:
        """The next response in the order sent; None after the final one."""
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    self._bytes -= item.size
                    self._release(item.size)  # handed on: the front end's own accounting takes over
                    self._lock.notify_all()  # a model waiting for room may go on
                    self._wake_producer()
                    return item
                if self._ended or self._cancelled:
                    return None
                waiter = self._waiter = self._loop.create_future()
            await waiter


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclasses.dataclass(slots=True)
class StreamItem:
    """One response of a stream as a front end writes it."""

    response: InferResponse | None
    """None for an error, and for a final flag the model sent without a response (Triton's empty final
    response, which gRPC clients may ask to receive)."""
    error: ApplianceError | None = None
    final: bool = False


class ResponseStream:
    """The responses of one request, in the order the model sent them: ``async for item in stream``.

    Call ``close()`` when done (it is synchronous, so it also runs in a ``finally`` of a cancelled
    task): closing before the final response cancels the request. ``on_close(error)`` runs once, with
    None when the final response arrived without an error, else what failed the request (a cancelled
    request gets ``asyncio.CancelledError``)."""

    def __init__(self, channel: ResponseChannel, convert: Callable[[RawResponse], InferResponse | None],
                 on_close: Callable[[BaseException | None], None], ran: asyncio.Future) -> None:
        self._channel = channel
        self.ran = ran
        """Done once the request has run (the backend's ``run_requests`` returned), failed or was dropped
        from the queue: responses may end before or after it."""
        self._convert = convert
        self._closers: list[Callable[[BaseException | None], None]] = [on_close]
        self._writer: Callable[[InferResponse], Awaitable[None]] | None = None
        self._outcome: BaseException | None = asyncio.CancelledError()
        self._closed = False

    def on_close(self, closer: Callable[[BaseException | None], None]) -> None:
        """Also run ``closer`` at close (first added, last run)."""
        self._closers.append(closer)

    def set_writer(self, writer: Callable[[InferResponse], Awaitable[None]]) -> None:
        """Pass each response through ``writer`` before it is handed out (shared-memory outputs)."""
        self._writer = writer

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> StreamItem:
        if self._closed:
            raise StopAsyncIteration
        raw = await self._channel.receive()
        if raw is None:
            self.close()
            raise StopAsyncIteration
        item = StreamItem(None, raw.error, raw.final)
        if raw.error is None and (raw.outputs is not None or raw.parameters or not raw.final):
            try:
                item.response = self._convert(raw)
                if item.response is not None and self._writer is not None:
                    await self._writer(item.response)
            except ApplianceError as exc:  # this response cannot be delivered; the model goes on
                item.response, item.error = None, exc
        if raw.final:
            self._outcome = item.error
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if isinstance(self._outcome, asyncio.CancelledError):  # the final response was not read
            self._channel.cancel()
        for closer in reversed(self._closers):
            try:
                closer(self._outcome)
            except Exception:  # noqa: BLE001 - one failing closer must not keep the others from running
                log.exception("closing the response stream of model %s", self._channel.label)


class Responses(Protocol):
    """What a front end reads: ``ResponseStream`` (a decoupled model) or ``OneResponse`` (any other)."""

    def __aiter__(self) -> Responses: ...

    async def __anext__(self) -> StreamItem: ...

    def close(self) -> None: ...


class OneResponse:
    """The single, final response of a model that is not decoupled, read like a stream."""

    def __init__(self, response: InferResponse) -> None:
        self._item: StreamItem | None = StreamItem(response, None, True)

    def __aiter__(self) -> OneResponse:
        return self

    async def __anext__(self) -> StreamItem:
        item, self._item = self._item, None
        if item is None:
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        self._item = None
