"""Which batches of one model version run inline on the event loop, and running them there.

A version whose plan runs inline (``ExecutionMode.inline``, see scheduler.execution) runs every batch up
to its largest on the loop while their recent runs keep within the budget: a batch size whose recent
runs take longer than the budget (their median: one slow run may be the OS preempting the loop) and
every larger one go to instance threads, and get another chance after a while. A backend that finds it
must not run on the loop (its model called another model from there) sends every later batch to threads.
Both schedulers (the default and dynamic one, the sequence batcher) hold one of these.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from appliance.engine.instances import InstancePool
from appliance.engine.scheduler.execution import ExecutionMode

__all__ = ["InlineRuns"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRY_AFTER = 30.0
"""Seconds after which batch sizes sent back to threads run inline again (and are judged again)."""
_WINDOW, _MIN_RUNS = 9, 5
"""The recent inline runs of one batch size whose median is held against the budget, and how many it
takes at least (a batch size that overruns is sent back to instance threads within a few runs)."""


class InlineRuns:
    """The inline runs of one model version (``label``) whose batches hold up to ``largest`` items."""

    def __init__(self, label: str, execution: ExecutionMode, largest: int) -> None:
        self._label = label
        self.execution = execution
        """Where batches run and why (threaded from the moment a backend refuses the loop)."""
        self._limit = max(largest, 1) if execution.inline else 0
        self.largest = self._limit
        """The largest batch (in items) that runs inline now."""
        self._runs: dict[int, deque[int]] = {}
        self._retry_at = 0.0

    def as_json(self) -> dict[str, Any]:
        return {**self.execution.as_json(), "inline_max_batch": self.largest}

    @property
    def possible(self) -> bool:
        """Whether any batch may run inline (not for a backend that runs elsewhere, or refused the loop)."""
        return self._limit > 0

    def admits(self, items: int, now: float) -> bool:
        """Whether a batch of ``items`` runs inline (``now``: the loop's time)."""
        if self.largest < self._limit and now >= self._retry_at:
            # A busy spell may have sent sizes back to threads: they get another chance now and then.
            self.largest = self._limit
            self._runs.clear()
        return items <= self.largest

    def run(self, pool: InstancePool, index: int, work: Callable[[Any], T], items: int, now: Callable[[], float]) -> T:
        """``work`` on instance ``index`` (acquired), here on the loop; its time counts against the budget
        when it returns. ``now``: the loop's clock."""
        # The loop thread's CPU time, not the wall clock: the OS running other processes, or another
        # thread holding the GIL, is the box's contention, not what the batch costs.
        started = time.thread_time_ns()
        try:
            outcome = pool.run_inline(index, work)
        finally:
            self._check_allowed(pool, index)
        took = time.thread_time_ns() - started
        recent = self._runs.get(items)
        if recent is None:
            recent = self._runs[items] = deque(maxlen=_WINDOW)
        recent.append(took)
        budget = self.execution.budget_ns
        # A run within the budget cannot lift the median over it: the median is read when the window
        # first has enough runs, then after runs over the budget.
        if len(recent) == _MIN_RUNS or (took > budget and len(recent) > _MIN_RUNS):
            median = statistics.median(recent)
            if median > budget:
                self.largest = min(self.largest, items - 1)
                self._retry_at = now() + _RETRY_AFTER
                log.info("model %s: batches of %d take %d µs inline (median), over the %d µs budget; batches of "
                         "%d and more run on instance threads", self._label, items, median // 1000, budget // 1000,
                         items)
        return outcome

    def _check_allowed(self, pool: InstancePool, index: int) -> None:
        """After an inline batch: a backend that found it must not run on the event loop (its model called
        another model from there) has every later batch run on instance threads."""
        refusal = pool.inline_refusal(index)
        if refusal is None:
            return
        self._limit = self.largest = 0
        self.execution = dataclasses.replace(self.execution, inline=False, reason=refusal)
        log.warning("model %s: batches run on instance threads from now on: %s", self._label, refusal)
