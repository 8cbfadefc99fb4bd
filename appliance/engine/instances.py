"""A model version's execution instances: each backend instance owns one thread.

The scheduler acquires a free instance, hands it work with ``execute``, and the instance frees itself
when its thread is done, even if every awaiting request was cancelled meanwhile: an instance is never
used by two threads at once, so backends need no locks.

A pool of ``depth`` 2 (a backend whose batches run in another process, which queues what it is sent)
lends each instance twice: the next batch is sent while the current one runs, so the model process
never waits for the daemon between batches. The instance's thread still runs one batch at a time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from appliance.backends import Backend
from appliance.engine.rate_limiter import InstanceLimits

__all__ = ["Finished", "InstancePool", "resolving"]

T = TypeVar("T")

Finished = Callable[[Any, BaseException | None], None]
"""Called with a batch's result, or its error."""


def resolving(future: asyncio.Future) -> Finished:
    """What resolves ``future`` with a result or an error (unless its waiter cancelled it)."""

    def resolve(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    return resolve

log = logging.getLogger(__name__)


class _Free:
    """The free places of a pool's instances, in the order they came back: what the pool used
    ``asyncio.Queue`` for (``get``, ``get_nowait``, ``put_nowait``; the pool counts ``_items`` itself),
    with its rules (waiters woken in order, a woken waiter that is cancelled passes its wake-up on), in a
    step each: one place is taken and given back per batch, and the queue's took about ten Python calls
    for that."""

    __slots__ = ("_loop", "_items", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[int] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def get_nowait(self) -> int:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def put_nowait(self, index: int) -> None:
        self._items.append(index)
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> int:
        while not self._items:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                if self._items and not waiter.cancelled():  # woken, then cancelled: the next one gets it
                    self._wake()
                raise
        return self._items.popleft()


class InstancePool:
    def __init__(self, label: str, backends: Sequence[Backend], limits: InstanceLimits | None = None,
                 depth: int = 1) -> None:
        """``limits``: the instances' places under the server's rate limiter (None: not rate limited); the
        schedulers take an instance's resources after the instance, and the pool unregisters them at close.
        ``depth``: how many batches an instance may be given at once (see the module's docstring)."""
        if not backends:
            raise ValueError("an instance pool needs at least one backend instance")
        if depth < 1:
            raise ValueError(f"an instance pool's depth must be at least 1, got {depth}")
        self.limits = limits
        self._label = label
        self.depth = depth
        self._backends = list(backends)
        # One plain thread per instance fed by a SimpleQueue: cheaper per dispatch than an executor.
        self._inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in backends]
        self._threads = [
            threading.Thread(target=self._serve, args=(inbox,), name=f"{label}#{i}", daemon=True)
            for i, inbox in enumerate(self._inboxes)
        ]
        for thread in self._threads:
            thread.start()
        self._free: _Free | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._elsewhere = [0 for _ in backends]
        """Per instance, the batches started with ``begin`` that have not finished."""
        self._elsewhere_lock = threading.Lock()
        """Guards ``_elsewhere`` (a plain lock: taken twice a batch, a Condition's ``with`` is Python code)."""
        self._elsewhere_done = threading.Condition(self._elsewhere_lock)
        """Notified as such a batch finishes (close waits for them)."""
        self._elsewhere_waiters = 0
        """Threads in ``_wait_elsewhere`` (a batch's end notifies only when one waits: notify_all is Python
        code, three calls a batch for nobody)."""
        self._closed: set[int] = set()
        """Instances whose backend close() has been called: a second close() leaves them be."""
        self._on_finish: Callable[[int], None] | None = None

    @property
    def size(self) -> int:
        return len(self._backends)

    @property
    def idle(self) -> int:
        """Instances with nothing to do (with depth > 1: free places, up to depth per instance)."""
        return len(self._free._items) if self._free is not None else 0  # (qsize without its call)

    def start(self, on_finish: Callable[[int], None] | None = None) -> None:
        """Bind to the running loop; call from inside it. ``on_finish(index)`` runs on the loop as a batch
        started with ``execute`` or ``begin`` finishes, in the same step that frees its instance (nothing
        can take the instance in between): the scheduler gives the instance's rate-limiter resources back
        there, so whoever takes the instance next (even with ``try_acquire``) finds them free. Batches run
        with ``run_inline`` leave that to their caller, which does it right after, in the same step."""
        self._loop = asyncio.get_running_loop()
        self._on_finish = on_finish
        self._free = _Free(self._loop)
        for _ in range(self.depth):
            for index in range(len(self._backends)):
                self._free.put_nowait(index)

    async def acquire(self) -> int:
        assert self._free is not None, "InstancePool.start() was not called"
        return await self._free.get()

    def execute(self, index: int, work: Callable[[Backend], T]) -> asyncio.Future[T]:
        """Run ``work(backend)`` on an acquired instance's thread; the instance is released when the
        thread finishes (not when the awaiting task goes away)."""
        assert self._loop is not None
        future: asyncio.Future[T] = self._loop.create_future()
        self.run(index, work, resolving(future))
        return future

    def run(self, index: int, work: Callable[[Backend], Any], then: Finished) -> None:
        """``execute`` with ``then(result, error)`` in place of a future: called on the loop in the step
        that frees the instance (a future's callbacks would run a step of the loop later)."""
        assert self._loop is not None
        loop = self._loop
        backend = self._backends[index]

        def run() -> None:
            try:
                result: Any = work(backend)
                error: BaseException | None = None
            except BaseException as exc:  # handed to the waiter, never lost in the thread
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(self._finish, index, then, result, error)
            except RuntimeError:  # the loop is closed: the daemon stopped without waiting for this batch
                pass

        self._inboxes[index].put(run)

    def begin(self, index: int, start: Callable[[Backend, Finished], bool]) -> asyncio.Future | None:
        """Start work on an acquired instance that completes on another thread by itself (a backend's
        ``start_requests``): ``start(backend, finished)`` returns False when it cannot, and then this
        returns None with the instance still acquired; otherwise ``finished(result, error)`` (from any
        thread) resolves the future and releases the instance, with no thread of the pool in between."""
        assert self._loop is not None
        future: asyncio.Future = self._loop.create_future()
        return future if self.start_elsewhere(index, start, resolving(future)) else None

    def start_elsewhere(self, index: int, start: Callable[[Backend, Finished], bool], then: Finished) -> bool:
        """``begin`` with ``then(result, error)`` in place of a future (see ``run``); False when ``start``
        cannot start the work (the instance is still acquired)."""
        assert self._loop is not None
        loop = self._loop

        lock, elsewhere = self._elsewhere_lock, self._elsewhere
        with lock:
            elsewhere[index] += 1
        loop_thread = threading.get_ident()
        returned = False

        def finished(result: Any, error: BaseException | None) -> None:
            with lock:  # (_finished_elsewhere, without its call)
                elsewhere[index] -= 1
                if self._elsewhere_waiters and not elsewhere[index]:
                    self._elsewhere_done.notify_all()
            if threading.get_ident() == loop_thread:  # read on the loop itself: no wake-up through its pipe
                if returned:  # the waiter's callbacks are attached: resolve it now, not an iteration later
                    self._finish(index, then, result, error)
                else:  # finished within start(): after the caller has attached its callbacks
                    loop.call_soon(self._finish, index, then, result, error)
                return
            try:
                loop.call_soon_threadsafe(self._finish, index, then, result, error)
            except RuntimeError:  # the loop is closed: the daemon stopped without waiting for this batch
                pass

        try:
            started = start(self._backends[index], finished)
        except Exception as exc:  # handed to the waiter, as a thread would
            self._finished_elsewhere(index)
            self._finish(index, then, None, exc)
            return True
        if not started:
            self._finished_elsewhere(index)
            return False
        returned = True
        return True

    def _finished_elsewhere(self, index: int) -> None:
        with self._elsewhere_lock:
            self._elsewhere[index] -= 1
            if self._elsewhere_waiters and not self._elsewhere[index]:
                self._elsewhere_done.notify_all()

    def _wait_elsewhere(self, index: int, deadline: float | None) -> bool:
        """Whether the batches started on instance ``index`` with ``begin`` all finished by ``deadline``."""
        with self._elsewhere_done:
            self._elsewhere_waiters += 1
            try:
                return self._elsewhere_done.wait_for(
                    lambda: not self._elsewhere[index],
                    None if deadline is None else max(0.0, deadline - time.monotonic()))
            finally:
                self._elsewhere_waiters -= 1

    def run_inline(self, index: int, work: Callable[[Backend], T]) -> T:
        """Run ``work(backend)`` on an acquired instance right here, on the event loop's thread, and
        release it: for work shorter than the hop to its thread (see scheduler.execution). The instance
        stays acquired while it runs, so its thread never touches the backend at the same time."""
        try:
            return work(self._backends[index])
        finally:
            self.release(index)

    def inline_refusal(self, index: int) -> str | None:
        """Why instance ``index`` may no longer run batches on the event loop (its backend found out while
        it served, see Backend.inline_safe), or None while it may."""
        backend = self._backends[index]
        if backend.inline_safe is not False:
            return None
        return backend.inline_refusal or "the backend can no longer run on the event loop"

    @staticmethod
    def _serve(inbox: queue.SimpleQueue) -> None:
        while (job := inbox.get()) is not None:
            job()

    def try_acquire(self) -> int | None:
        """A free instance right now, or None."""
        assert self._free is not None, "InstancePool.start() was not called"
        try:
            return self._free.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def release(self, index: int) -> None:
        """Give back an instance that was acquired but not used."""
        assert self._free is not None
        self._free.put_nowait(index)

    def _finish(self, index: int, then: Finished, result: Any, error: BaseException | None) -> None:
        # ``then`` first, while the instance is still held (it resolves a future, or hands the batch to the
        # scheduler). on_finish runs here, in the step that frees the instance: a future's callbacks run a
        # step later, and a request arriving between the two may take the instance with try_acquire, which
        # found the rate-limiter resources of the batch that just ended still held and took them twice
        # (security finding "High 5"). After release, so that a waiter for a free instance is woken before
        # the grants on_finish schedules (the limiter lets an instance with work re-take).
        try:
            then(result, error)
        except Exception:  # the instance must come back whatever happened: never a hang
            log.exception("instance %s#%d: handling a finished batch failed", self._label, index)
        self.release(index)
        if self._on_finish is not None:
            try:
                self._on_finish(index)
            except Exception:  # the waiter has its result and the instance is back: never a hang
                log.exception("instance %s#%d: on_finish failed", self._label, index)

    async def drain(self, timeout: float, busy: Callable[[], bool] | None = None) -> bool:
        """Wait until ``busy`` (the scheduler in front: work queued or running) is false, then until every
        instance is idle; False if ``timeout`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (busy is not None and busy()) or self.idle < self.size * self.depth:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def close(self, timeout: float | None = None) -> list[BaseException]:
        """Stop the threads and close the backends (blocking); returns errors instead of raising. A
        second call closes only what the first had to leave running.

        With a ``timeout``, an instance whose thread is still running a batch when it expires is left
        alone (reported as a TimeoutError): closing a runtime under a running call is not safe, and its
        daemon thread ends with the process."""
        deadline = None if timeout is None else time.monotonic() + timeout
        errors: list[BaseException] = []
        for inbox in self._inboxes:
            inbox.put(None)
        for index, (thread, backend) in enumerate(zip(self._threads, self._backends)):
            if index in self._closed:  # closed by an earlier call
                continue
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not self._wait_elsewhere(index, deadline):
                errors.append(TimeoutError(
                    f"instance {thread.name} was still running a batch when its time to close ran out; "
                    "left running until the process exits"
                ))
                continue
            if thread.is_alive():
                errors.append(TimeoutError(
                    f"instance {thread.name} was still running a batch when its time to close ran out; "
                    "left running until the process exits"
                ))
                continue
            self._closed.add(index)
            try:
                backend.close()
            except Exception as exc:
                errors.append(exc)
        if self.limits is not None:  # a batch still running gives its resources up: the version is gone
            self.limits.close()
        return errors
