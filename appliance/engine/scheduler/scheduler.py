"""One model version's scheduler: a queue, a batcher task, and the instances it feeds.

Without dynamic batching each request executes alone (Triton's default scheduler); a backend that hands
work to another process may take several queued requests in one hand-off (a group), and still runs each
alone, in order. With it, requests
queued while the instances are busy, or that arrive within ``max_queue_delay``, are combined up to
``max_batch_size``, preferring ``preferred_batch_size``; outputs are split back per request. Every
waiter gets a result or an exception: a failed batch fails each request in it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.backends import BackendRequest
from appliance.backends.base import Outputs, Reschedule, reschedule_refused
from appliance.core.errors import ApplianceError, InferenceFailed, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler.completion import Answers, answer_later, mark_compute
from appliance.engine.scheduler.execution import THREADED, ExecutionMode, execute_batch, run_batch
from appliance.engine.scheduler.inline import InlineRuns
from appliance.engine.scheduler.policy import SchedulerPolicy
from appliance.engine.scheduler.queue import Pending, RequestQueue
from appliance.engine.stats import BatchTiming, ModelStats, StepTiming

if TYPE_CHECKING:
    from appliance.backends.base import ResponseSink
    from appliance.engine.trace import Trace

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    takes_straight = True
    """``ModelVersion.begin`` queues requests here with ``enqueue`` (see model.StraightScheduler)."""

    def __init__(self, label: str, pool: InstancePool, policy: SchedulerPolicy, stats: ModelStats,
                 execution: ExecutionMode = THREADED, group: int = 1) -> None:
        """``group``: without dynamic batching, how many queued requests one hand-off to an instance may
        take (each still its own execution; see Backend.group_limit)."""
        self.label = label
        self.pool = pool
        self.policy = policy
        self.stats = stats
        self._queue = RequestQueue(policy)
        self._seq = itertools.count()
        self._answers: Answers[Pending] = Answers(policy.preserve_ordering, lambda pending: pending.seq)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._flush_scheduled = False
        self._in_flight = 0
        self._group = max(group, 1) if not policy.dynamic else 1
        self._inline = InlineRuns(label, execution, policy.max_batch_size)
        level = policy.level_of({})
        self._plain = level, policy.timeout_of(level, {})  # a request without parameters' level and timeout

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the loop-bound parts; call from inside the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self.pool.start(on_finish=self._ran)  # resources go back in the step that frees the instance
        self._task = self._loop.create_task(self._batch_loop(), name=f"batcher:{self.label}")

    @property
    def execution(self) -> dict[str, Any]:
        """Where batches run (inline or threaded), why, and the largest batch still run inline."""
        return self._inline.as_json()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def drain(self, timeout: float) -> bool:
        """Stop taking requests; wait (bounded) until queued and running work has finished."""
        self._closing = True
        return await self.pool.drain(timeout, busy=lambda: bool(self._queue or self._in_flight))

    async def close(self, timeout: float | None = None) -> list[BaseException]:
        """Fail whatever is still queued, then stop the instances (their threads are joined off the
        event loop, within ``timeout`` when given); returns the errors instead of raising them."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        for pending in list(self._queue):
            self._queue.remove(pending)
            self._complete(pending, None, Unavailable(f"model {self.label} was unloaded before this request ran"))
        return await asyncio.to_thread(self.pool.close, timeout)

    # -- the request side --------------------------------------------------------------------

    async def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        batch_size: int,
        parameters: Mapping[str, Any],
        trace: Trace | None = None,
        timing: StepTiming | None = None,
        request_id: str = "",
        sink: ResponseSink | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, np.ndarray]:
        """Queue one validated request and wait for its outputs; ``trace`` gets QUEUE_START and the
        COMPUTE_* timestamps of the batch it ran in, ``timing`` its queue and compute times. For a
        decoupled model, ``sink`` receives the responses and this returns once the backend's
        ``run_requests`` has (the instance is free again while responses may still follow);
        ``cancelled`` is the request's cancellation probe."""
        flushing = not self._flush_scheduled
        pending = self._queued(inputs, outputs, batch_size, parameters, trace, timing, request_id, sink, cancelled,
                               None)
        if flushing and self._group > 1:
            # A backend that takes groups (a model process): as ``enqueue`` does, the queue is dispatched once
            # the loop has run what this wake-up received, so that those requests go in one hand-off.
            self._flush_soon()
        elif flushing:
            self._flush_scheduled = True
            try:
                if self.policy.dynamic:
                    # Dispatch one loop iteration later, once every request that arrived in this
                    # iteration has queued: requests that arrive together are batched together.
                    await asyncio.sleep(0)
            except BaseException:  # cancelled meanwhile (its client went away): it never executes
                self.withdraw(pending)
                raise
            finally:  # even if this request was cancelled meanwhile: the others must not wait
                if self._flush_scheduled:
                    # Here rather than in a callback of its own: an inline batch has completed this
                    # request when it returns, so it answers without another loop iteration.
                    self._flush()
        try:
            return await pending.future
        except asyncio.CancelledError:
            # A client that went away while queued (cancelling this task cancels the future it awaits):
            # the request never executes.
            if pending.future.cancelled():
                self._forget(pending)
            raise

    def enqueue(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                parameters: Mapping[str, Any], then: Callable[[Any, BaseException | None], None],
                trace: Trace | None = None, request_id: str = "", timing: StepTiming | None = None) -> Pending:
        """``submit`` without a task waiting: queue one validated request; ``then(outputs, error)`` is
        called in the step that completes it (the straight line of appliance.protocol.inference). The
        queue is dispatched once the loop has run what this step of it received, so that requests that
        arrive together go to a model process in one hand-off. ``withdraw`` takes the request back."""
        pending = self._queued(inputs, outputs, batch_size, parameters, trace, timing, request_id, None, None, then)
        if not self._flush_scheduled:
            self._flush_soon()
        return pending

    def withdraw(self, pending: Pending) -> bool:
        """Its client went away: a queued request never executes, a running one reads as cancelled to its
        model, and neither is answered; True unless it had its answer already."""
        if not pending.future.cancel():
            return False
        self._forget(pending)
        return True

    def _forget(self, pending: Pending) -> None:
        """A cancelled request: out of the queue, if it is still there (its place in the order is kept)."""
        if self._queue.remove(pending):
            self._complete(pending, None, None)

    def _queued(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                parameters: Mapping[str, Any], trace: Trace | None, timing: StepTiming | None, request_id: str,
                sink: ResponseSink | None, cancelled: Callable[[], bool] | None,
                then: Callable[[Any, BaseException | None], None] | None) -> Pending:
        """A new request in the queue, refused (Unavailable) while unloading or when its level is full."""
        assert self._loop is not None, "Scheduler.start() was not called"
        if self._closing:
            raise Unavailable(f"model {self.label} is unloading", retry_after=1)
        policy = self.policy
        if parameters:
            level = policy.level_of(parameters)
            timeout = policy.timeout_of(level, parameters)
        else:  # the common request: no priority, no timeout of its own
            level, timeout = self._plain
        loop = self._loop
        key = tuple(sorted((name, array.shape[1:]) for name, array in inputs.items())) if policy.dynamic else ()
        if self._queue.bounded and self._queue.level_full(level):
            raise Unavailable(
                f"the queue of model {self.label} is full "
                f"(max_queue_size {policy.queue_policy(level).max_queue_size}); retry later",
                retry_after=1,
            )
        # Sequence numbers go only to accepted requests: preserve_ordering waits for each of them.
        future = loop.create_future()
        # Without a probe of its own, a request is cancelled when its waiter is (the client went away: the
        # front end's task was cancelled, and with it the future it awaited), so a running model sees
        # request.is_cancelled() turn True; Future.cancelled() only reads a flag, from any thread.
        request = BackendRequest(inputs, tuple(outputs), parameters, batch_size, request_id, 0, 0,
                                 _timeout_us(parameters) if parameters else 0, sink, cancelled or future.cancelled)
        pending = Pending(request, batch_size, key, future, loop.time(), level, next(self._seq), trace, timing, then)
        if trace is not None:
            trace.mark("QUEUE_START")
        self._queue.push(pending)
        if timeout > 0:
            pending.timer = loop.call_at(pending.arrival + timeout, self._expire, pending, timeout)
        return pending

    def _expire(self, pending: Pending, timeout: float) -> None:
        pending.timer = None
        if not pending.queued or pending.delayed:
            return
        if self.policy.queue_policy(pending.level).delay_on_timeout:
            self._queue.delay(pending)
            return
        self._queue.remove(pending)
        self._complete(
            pending, None,
            Unavailable(f"request timed out after {timeout * 1000:.1f} ms in the queue of model {self.label}"),
        )

    # -- the batcher -------------------------------------------------------------------------

    def _flush_soon(self) -> None:
        """Dispatch once the loop has run what this wake-up received (``_flush_if_scheduled``)."""
        self._flush_scheduled = True
        self._loop.call_soon(self._flush_if_scheduled)  # type: ignore[union-attr]

    def _flush_if_scheduled(self) -> None:
        if self._flush_scheduled:  # (a submit's own flush may have come first)
            self._flush()

    def _flush(self) -> None:
        """Dispatch every batch that is ready to free instances, without waiting for anything."""
        self._flush_scheduled = False
        assert self._loop is not None and self._wakeup is not None
        # Until a request enqueued meanwhile schedules the next flush: an inline batch answers its requests
        # within this loop, and a pipelining client's next request is enqueued from that answer; it waits
        # for the next step, as a client's next request waits behind the others' reads.
        queue = self._queue
        while queue.count and not self._flush_scheduled:
            batch, final = self._peek_batch(self.pool.idle)
            if not final and self.policy.dynamic and self._delay_left(batch[0]) > 0:
                break  # the batcher task waits for company
            index = self.pool.try_acquire()
            if index is None:
                break  # the batcher task waits for an instance
            limits = self.pool.limits
            if limits is not None and not limits.try_take(index):
                self.pool.release(index)
                break  # the batcher task waits for the instance's resources, in rank order
            if not final and self.policy.preferred_batch_sizes:
                batch = self._trim_to_preferred(batch)
            queue.take(batch)
            self._dispatch(index, batch)
        if queue.count:
            self._wakeup.set()

    def _delay_left(self, oldest: Pending) -> float:
        assert self._loop is not None
        return oldest.arrival + self.policy.max_queue_delay - self._loop.time()

    async def _batch_loop(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._queue or self._flush_scheduled:  # (a flush to come takes what it can first)
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            index = await self.pool.acquire()
            limits = self.pool.limits
            held = False
            try:
                if limits is not None:  # the rate limiter: the instance runs once its resources are free
                    await limits.take(index)
                    held = True
                batch = await self._collect_batch()
            except BaseException as exc:
                if held:
                    assert limits is not None
                    limits.give_back(index, executed=False)
                self.pool.release(index)
                if not isinstance(exc, Exception):
                    raise
                # Never the end of the batcher, which would leave every later request waiting: the next
                # batch's requests get the error, and it goes on with the rest.
                self._fail_next(exc)
                continue
            if batch:
                self._dispatch(index, batch)
            else:
                if limits is not None:
                    limits.give_back(index, executed=False)
                self.pool.release(index)

    def _fail_next(self, error: Exception) -> None:
        """The next batch's requests get ``error`` (the batcher could not run them)."""
        batch, _ = self._peek_batch()
        failure = self._failure(error, len(batch))
        for pending in batch:
            self._queue.remove(pending)
            self._complete(pending, None, failure)

    def _batch_limit(self, idle: int) -> int:
        """Items the next batch may take: max_batch_size, but with several idle instances and no
        preferred sizes, the queued work is spread over them rather than piled onto one."""
        limit = self.policy.max_batch_size
        if self.policy.batch_cap:
            limit = min(limit, self.policy.batch_cap)
        if idle > 1 and not self.policy.preferred_batch_sizes:
            limit = min(limit, max(1, -(-self._queue.items // idle)))
        return limit

    def _peek_batch(self, idle: int = 1) -> tuple[list[Pending], bool]:
        """The requests that would form the next batch, and whether it can grow no further."""
        policy = self.policy
        if not policy.dynamic:  # the oldest request, and for a backend that takes groups those behind it
            take = self._group
            if take > 1 and idle > 1:  # spread over the idle instances, as a batch is (_batch_limit)
                take = min(take, max(1, -(-len(self._queue) // min(idle, self.pool.size))))
            return self._queue.head(take), True
        batch: list[Pending] = []
        size = 0
        limit = self._batch_limit(idle)
        target = policy.preferred_batch_sizes[-1] if policy.preferred_batch_sizes else limit
        for pending in self._queue:
            if not batch:
                batch.append(pending)
                size = pending.size
                continue
            if pending.key != batch[0].key or size + pending.size > limit:
                return batch, True  # FIFO: the next request cannot join, so this batch is final
            batch.append(pending)
            size += pending.size
            if size >= target:
                return batch, True
        return batch, size >= target

    def _trim_to_preferred(self, batch: list[Pending]) -> list[Pending]:
        preferred = set(self.policy.preferred_batch_sizes)
        best = 0
        for count, total in enumerate(itertools.accumulate(p.size for p in batch), start=1):
            if total in preferred:
                best = count
        return batch[:best] if best else batch

    async def _collect_batch(self) -> list[Pending]:
        assert self._loop is not None and self._wakeup is not None
        policy = self.policy
        while True:
            batch, final = self._peek_batch(self.pool.idle + 1)  # + the instance this task holds
            if not batch or final:
                break
            wait = self._delay_left(batch[0])
            if wait <= 0:
                if policy.preferred_batch_sizes:
                    batch = self._trim_to_preferred(batch)
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
            except TimeoutError:
                pass
        self._queue.take(batch)
        return batch

    def _dispatch(self, index: int, batch: list[Pending]) -> None:
        assert self._loop is not None
        stamp = time.monotonic_ns()
        if len(batch) == 1:  # (the common batch: no comprehension's call)
            queue_ns, requests = [stamp - batch[0].arrival_ns], [batch[0].request]
        else:
            queue_ns = [stamp - p.arrival_ns for p in batch]
            requests = [p.request for p in batch]
        grouped = len(batch) > 1 and not self.policy.dynamic  # a group: each request its own execution
        if not grouped and self._inline.possible:
            items = _items(batch)
            if self._inline.admits(items, self._loop.time()):
                self._run_inline(index, batch, queue_ns, functools.partial(execute_batch, requests=requests), items)
                return
        self._in_flight += len(batch)
        run_batch(self.pool, index, requests, functools.partial(self._finish_batch, batch, queue_ns), each=grouped)

    def _ran(self, index: int) -> None:
        """Instance ``index`` finished a batch: its rate-limiter resources go back, in the step that frees
        the instance (a request that takes it next must find them free)."""
        if self.pool.limits is not None:
            self.pool.limits.give_back(index, executed=True, pending=self._queue.count > 0)

    def _run_inline(self, index: int, batch: list[Pending], queue_ns: list[int], work: Any, items: int) -> None:
        assert self._loop is not None
        self._in_flight += len(batch)  # (as for a batch run elsewhere: _finish_batch counts it out)
        try:
            outcome = self._inline.run(self.pool, index, work, items, self._loop.time)
        except Exception as exc:  # as a thread hands it over: every waiter gets it
            self._ran(index)
            self._finish_batch(batch, queue_ns, None, exc)
            return
        self._ran(index)
        self._finish_batch(batch, queue_ns, outcome, None)

    def _finish_batch(self, batch: list[Pending], queue_ns: list[int], outcome: Any,
                      error: BaseException | None) -> None:
        """A batch's end (``outcome`` is None when it failed with ``error``): in the step that frees the
        instance, just before the pool releases it and gives its rate-limiter resources back
        (InstancePool._finish), or right after an inline run."""
        self._in_flight -= len(batch)
        if error is not None:
            error = self._failure(error, len(batch))
            if isinstance(error, InferenceFailed):  # it ran and failed (not refused before running)
                self.stats.record_failed_batch(_items(batch))
            for pending in batch:
                self._complete(pending, None, error)
            return
        if len(outcome) == 3:  # a group: each request was its own execution, and may have failed alone
            results, group_timing, failed = outcome
            timing = _share(group_timing, len(batch))
            if not failed:
                self.stats.record_executions([p.size for p in batch], queue_ns, timing)
            else:
                self.stats.record_executions([p.size for i, p in enumerate(batch) if i not in failed],
                                             [w for i, w in enumerate(queue_ns) if i not in failed], timing)
            for index in sorted(failed):
                results[index] = self._failure(results[index], 1)
                if isinstance(results[index], InferenceFailed):
                    self.stats.record_failed_batch(batch[index].size)
        else:
            results, timing = outcome
            self.stats.record_batch(_items(batch), len(batch), queue_ns, timing)
        complete = self._answers.complete
        for pending, result, waited in zip(batch, results, queue_ns):
            if pending.trace is not None:
                mark_compute(pending.trace, timing)
            if pending.timing is not None:
                pending.timing.add(waited, timing)
            if type(result) is Outputs:  # the common result, told first
                complete(pending, result, None)
            elif isinstance(result, BaseException):
                complete(pending, None, result)
            elif isinstance(result, Future):  # the model answers later (a Python response sender)
                self._complete_later(pending, result)
            elif isinstance(result, Reschedule):  # only the iterative sequence batcher runs it again
                complete(pending, None, reschedule_refused(self.label))
            else:
                complete(pending, result, None)

    def _failure(self, error: BaseException, requests: int) -> BaseException:
        """An execution's error as the waiters get it: anything but the appliance's own errors is logged
        and becomes InferenceFailed."""
        if isinstance(error, ApplianceError):
            return error
        log.error("model %s: batch of %d failed: %r", self.label, requests, error)
        return InferenceFailed(f"model {self.label} failed: {type(error).__name__}: {error}")

    def _complete_later(self, pending: Pending, answer: Future) -> None:
        assert self._loop is not None
        answer_later(self._loop, answer, lambda result, error: self._complete(pending, result, error))

    def _complete(self, pending: Pending, result: Any, error: BaseException | None) -> None:
        self._answers.complete(pending, result, error)


def _share(timing: BatchTiming, count: int) -> BatchTiming:
    """One request's part of what a group of ``count`` executions cost (each is counted on its own)."""
    return BatchTiming(timing.input_ns // count, timing.infer_ns // count, timing.output_ns // count,
                       timing.start_ns, timing.end_ns)


def _items(batch: list[Pending]) -> int:
    """The batch items a batch's requests carry together (a batch of one, the common one, without a sum)."""
    return batch[0].size if len(batch) == 1 else sum(p.size for p in batch)


def _timeout_us(parameters: Mapping[str, Any]) -> int:
    """The client's ``timeout`` parameter (microseconds, Triton's), 0 when it set none."""
    value = parameters.get("timeout")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
