"""What runs a batch: one batch through the backend, timed; and where it runs (an instance's thread,
or the event loop itself for a model faster than the hop to a thread and back).

The backend gathers inputs and splits outputs (by default, concatenation along the batch dimension:
see appliance.backends.base). On an instance's thread large inputs never stall the event loop; a tiny
model (a batch in a few µs) costs less run inline than the ≈ 50–100 µs a thread hop costs, so a plan
whose measured batch latency is below the measured hop, and below a budget the loop may block for, runs
inline. A backend whose batches run Python code under the GIL (a trusted Python model in the daemon)
gains nothing from a thread, which cannot run beside the loop: the budget alone bounds it. A batch size
whose inline runs overrun the budget (their median) goes back to threads, and larger ones, for a while.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from appliance.backends import Backend, BackendRequest
from appliance.backends.base import BatchResult, RequestResult
from appliance.engine.stats import BatchTiming

if TYPE_CHECKING:
    from appliance.engine.instances import Finished, InstancePool

__all__ = ["GIL_BUDGET_NS", "INLINE_BUDGET_NS", "THREADED", "ExecutionMode", "choose_execution",
           "execute_batch", "execute_each", "measure_thread_hop", "plan_batch_ns", "run_batch"]

INLINE_BUDGET_NS = 200_000
"""The longest a batch run inline may block the event loop."""
GIL_BUDGET_NS = 1_000_000
"""The same for a batch that is Python code under the GIL (a trusted Python model's ``execute()``). On an
instance thread such a batch blocks the loop too: the loop waits for the GIL while it runs, and pays the
hop and the GIL's hand-offs besides (a sequence model's batches of 8 rows, 200-300 µs each, ran 1.5x
slower threaded). Above it a batch may spend part of its time outside the GIL (numpy on large arrays),
where a thread lets the loop run beside it."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutionMode:
    """Where a model version's batches run, and the measurements that decided it."""

    inline: bool
    reason: str
    batch_ns: int | None = None
    """The plan's measured batch latency (selection's latency on its smallest tuning input)."""
    hop_ns: int | None = None
    """The measured round trip from the event loop to an instance thread and back."""
    budget_ns: int = INLINE_BUDGET_NS

    def as_json(self) -> dict[str, Any]:
        return {
            "execution": "inline" if self.inline else "threaded",
            "reason": self.reason,
            "batch_us": None if self.batch_ns is None else round(self.batch_ns / 1000, 1),
            "hop_us": None if self.hop_ns is None else round(self.hop_ns / 1000, 1),
            "budget_us": round(self.budget_ns / 1000, 1),
        }


THREADED = ExecutionMode(False, "the default: every batch runs on an instance thread")


def choose_execution(batch_ns: int | None, hop_ns: int | None, inline_safe: bool,
                     budget_ns: int = INLINE_BUDGET_NS, holds_gil: bool = False,
                     unsafe_reason: str = "") -> ExecutionMode:
    """Inline when the plan's measured batch latency is below both the measured thread hop and the
    budget, and the backend runs in this process (one that waits on another process must never block
    the loop); threaded otherwise, saying why (``unsafe_reason``: why a backend is not inline-safe, when
    it says). ``holds_gil``: the batch is Python code under the GIL, which a thread would not run beside
    the loop anyway, so only the budget counts."""
    def mode(inline: bool, reason: str) -> ExecutionMode:
        return ExecutionMode(inline, reason, batch_ns, hop_ns, budget_ns)

    if holds_gil:
        budget_ns = max(budget_ns, GIL_BUDGET_NS)
    if not inline_safe:
        return mode(False, unsafe_reason or "a batch may wait on something else (another process, the GPU, or a "
                                            "model it calls back through the event loop)")
    if batch_ns is None:
        return mode(False, "the plan's batch latency was not measured (selection off, or only one plan)")
    if batch_ns >= budget_ns:
        return mode(False, f"a batch ({batch_ns / 1000:.0f} µs) takes longer than the event loop may block "
                           f"({budget_ns / 1000:.0f} µs)")
    if holds_gil:
        return mode(True, f"a batch ({batch_ns / 1000:.1f} µs) is Python code under the GIL, which a thread would not "
                          f"run beside the event loop, and fits its budget ({budget_ns / 1000:.0f} µs)")
    if not hop_ns:
        return mode(False, "the thread hop was not measured")
    if batch_ns >= hop_ns:
        return mode(False, f"a batch ({batch_ns / 1000:.0f} µs) costs more than the hop to a thread "
                           f"({hop_ns / 1000:.0f} µs)")
    return mode(True, f"a batch ({batch_ns / 1000:.1f} µs) costs less than the hop to a thread "
                      f"({hop_ns / 1000:.0f} µs)")


def plan_batch_ns(selection: Mapping[str, Any] | None) -> int | None:
    """The chosen plan's measured batch latency from a selection decision (None when not measured)."""
    if not selection or selection.get("status") != "measured":
        return None
    for row in selection.get("candidates") or ():
        if row.get("plan") == selection.get("chosen") and isinstance(row.get("latency_ms"), (int, float)):
            return int(row["latency_ms"] * 1e6)
    return None


async def measure_thread_hop(rounds: int = 200) -> int:
    """Median ns for the running loop to hand a no-op to a thread and be woken with its result, by the
    path an instance takes (a SimpleQueue in, call_soon_threadsafe back)."""
    loop = asyncio.get_running_loop()
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def serve() -> None:
        while (future := inbox.get()) is not None:
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=serve, name="hop-probe", daemon=True)
    thread.start()
    samples = []
    try:
        for _ in range(rounds):
            future = loop.create_future()
            start = time.perf_counter_ns()
            inbox.put(future)
            await future
            samples.append(time.perf_counter_ns() - start)
    finally:
        inbox.put(None)
    return int(statistics.median(samples[rounds // 10:]))  # the first rounds warm the thread up


def execute_batch(
    backend: Backend, requests: Sequence[BackendRequest]
) -> tuple[list[RequestResult], BatchTiming]:
    """Run requests as one batch: one result (or that request's error) per request, and what it cost."""
    # monotonic_ns, not perf_counter_ns: the start and end go into traces beside the front ends' times.
    start = time.monotonic_ns()
    batch = backend.run_requests(requests)
    end = time.monotonic_ns()
    infer = max(0, end - start - batch.input_ns - batch.output_ns)
    return batch.results, BatchTiming(batch.input_ns, infer, batch.output_ns, start, end)


def execute_each(
    backend: Backend, requests: Sequence[BackendRequest]
) -> tuple[list[RequestResult], BatchTiming, frozenset[int]]:
    """Run a group of requests one at a time, each its own execution (on the instance's thread, when the
    backend could not start them together): their results, what the group cost, and the requests whose
    execution raised (their results are the exceptions, which the scheduler words as for a batch)."""
    start = time.monotonic_ns()
    results: list[RequestResult] = []
    failed: set[int] = set()
    input_ns = output_ns = 0
    for index, request in enumerate(requests):
        try:
            batch = backend.run_requests([request])
        except Exception as exc:  # noqa: BLE001 - this request's execution failed; the others run on
            results.append(exc)
            failed.add(index)
            continue
        results.extend(batch.results)
        input_ns += batch.input_ns
        output_ns += batch.output_ns
    end = time.monotonic_ns()
    return results, BatchTiming(input_ns, max(0, end - start - input_ns - output_ns), output_ns, start, end), \
        frozenset(failed)


class _Started:
    """Requests started on an instance with the backend's ``start_requests`` (as one batch) or ``start_each``
    (a group, each its own execution), where it completes on a thread of its own (e.g. when another
    process replies): called by the pool as ``start(backend, finished)`` (False when the backend cannot
    start them that way, and ``finished`` is never called), then ``done`` by the backend, which hands
    ``finished`` what ``execute_batch`` (``execute_each``) returns, or the error. One object for both, as
    the pool's start and the backend's callback: a batch's start took a partial, two calls and a closure."""

    __slots__ = ("_requests", "_grouped", "_finished", "_start")

    def __init__(self, requests: Sequence[BackendRequest], grouped: bool) -> None:
        self._requests = requests
        self._grouped = grouped
        self._finished: Callable[[Any, BaseException | None], None] | None = None
        self._start = 0

    def __call__(self, backend: Backend, finished: Callable[[Any, BaseException | None], None]) -> bool:
        self._finished = finished
        self._start = time.monotonic_ns()
        if self._grouped:
            return backend.start_each(self._requests, self.done)
        return backend.start_requests(self._requests, self.done)

    def done(self, batch: BatchResult | BaseException) -> None:
        finished = self._finished
        assert finished is not None
        if isinstance(batch, BaseException):
            finished(None, batch)
            return
        start, end = self._start, time.monotonic_ns()
        infer = end - start - batch.input_ns - batch.output_ns  # (not max(): it parses keywords every call)
        if infer < 0:
            infer = 0
        timing = BatchTiming(batch.input_ns, infer, batch.output_ns, start, end)
        finished((batch.results, timing, batch.failed) if self._grouped else (batch.results, timing), None)


def run_batch(pool: InstancePool, index: int, requests: Sequence[BackendRequest], then: Finished,
              each: bool = False) -> None:
    """Run ``requests`` on the acquired instance ``index``, as one batch or (``each``) one at a time, and call
    ``then(result, error)`` with what ``execute_batch`` (``execute_each``) returns, in the step of the loop
    that frees the instance: a backend that runs them in another process starts them from here and is woken
    by its reply, with no instance thread in between; otherwise (or when it cannot now) the instance's
    thread runs them."""
    if not pool.start_elsewhere(index, _Started(requests, each), then):
        pool.run(index, functools.partial(execute_each if each else execute_batch, requests=requests), then)

