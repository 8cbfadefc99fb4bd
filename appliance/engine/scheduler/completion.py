"""How a batch's answers reach the requests waiting for them, for both batchers (the dynamic one and the
sequence batcher): each request is answered once, in arrival order when the model's policy preserves
it, later when the model answers after its batch returned (a Python response sender), and a traced
request gets its batch's COMPUTE_* marks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from appliance.engine.stats import BatchTiming
    from appliance.engine.trace import Trace

__all__ = ["Answers", "Waiting", "answer_later", "mark_compute", "outcome", "run_as_task"]

log = logging.getLogger(__name__)


class Waiting(Protocol):
    """A queued request as the batchers keep it: the future its client awaits."""

    future: asyncio.Future
    completed: bool
    then: Callable[[Any, BaseException | None], None] | None
    """Given the answer instead of ``future``, where set (``future`` then gets None, to mark it done)."""


W = TypeVar("W", bound=Waiting)


class Answers(Generic[W]):
    """Hands each request its answer once: at once, or (``preserve_ordering``) in the order the requests
    arrived, numbered from 0 by ``order_of``; an answer ready early waits for the earlier ones."""

    def __init__(self, preserve_ordering: bool, order_of: Callable[[W], int]) -> None:
        self._ordered = preserve_ordering
        self._order_of = order_of
        self._next = 0
        self._finished: dict[int, tuple[W, Any, BaseException | None]] = {}

    def complete(self, request: W, result: Any, error: BaseException | None) -> None:
        if request.completed:
            return
        request.completed = True
        if not self._ordered:
            _resolve(request, result, error)
            return
        self._finished[self._order_of(request)] = (request, result, error)
        while self._next in self._finished:
            _resolve(*self._finished.pop(self._next))
            self._next += 1


def _resolve(request: Waiting, result: Any, error: BaseException | None) -> None:
    if request.future.done():  # the client went away (its waiter was cancelled, or it was withdrawn)
        return
    then = request.then
    if then is not None:
        request.future.set_result(None)
        try:
            then(result, error)
        except Exception:  # one answer's fault must not keep the rest of its batch from theirs
            log.exception("answering a request failed")
        return
    if error is not None:
        request.future.set_exception(error)
    else:
        request.future.set_result(result)


def answer_later(loop: asyncio.AbstractEventLoop, answer: Future,
                 deliver: Callable[[Any, BaseException | None], None]) -> None:
    """A model that answers after its batch returned: ``deliver(result, error)`` on ``loop`` once it has."""

    def answered(done: Future) -> None:
        error = done.exception()
        try:
            loop.call_soon_threadsafe(deliver, None if error else done.result(), error)
        except RuntimeError:  # the loop has closed: the daemon stopped, nobody waits any more
            pass

    answer.add_done_callback(answered)


def mark_compute(trace: Trace, timing: BatchTiming) -> None:
    """Triton's COMPUTE_* timestamps from the batch's timing, kept in order even if a backend's input and
    output times overlap its total."""
    start, end = timing.start_ns, timing.end_ns
    input_end = min(start + timing.input_ns, end)
    output_start = max(input_end, end - timing.output_ns)
    for name, ns in (("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                     ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", end)):
        trace.mark(name, ns)


def outcome(task: asyncio.Future) -> tuple[Any, BaseException | None]:
    """A finished task's ``(result, error)`` as a ``then`` callback takes them: CancelledError when it was
    cancelled."""
    if task.cancelled():
        return None, asyncio.CancelledError()
    error = task.exception()
    return (None, error) if error is not None else (task.result(), None)


def run_as_task(work: Coroutine[Any, Any, Any],
                then: Callable[[Any, BaseException | None], None]) -> Callable[[], object]:
    """``work`` as a task of the running loop whose end calls ``then(result, error)`` (``outcome``); what
    cancels it."""
    task = asyncio.get_running_loop().create_task(work)
    task.add_done_callback(lambda done: then(*outcome(done)))
    return task.cancel
