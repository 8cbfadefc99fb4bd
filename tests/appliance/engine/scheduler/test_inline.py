"""InlineRuns on its own: which batch sizes run inline, the budget held against their median, the retry,
and a backend that refuses the loop."""

from __future__ import annotations

import time

import pytest

import appliance.engine.scheduler.inline as inline_module
from appliance.engine.scheduler.execution import THREADED, ExecutionMode
from appliance.engine.scheduler.inline import InlineRuns

BUDGET_NS = 200_000
INLINE = ExecutionMode(True, "test", 1_000, 50_000, BUDGET_NS)


class Pool:
    """The two calls InlineRuns makes of an InstancePool."""

    def __init__(self) -> None:
        self.released: list[int] = []
        self.refusal: str | None = None

    def run_inline(self, index, work):
        try:
            return work("backend")
        finally:
            self.released.append(index)

    def inline_refusal(self, index):
        return self.refusal


def _spin(ns: int):
    def work(backend):
        end = time.thread_time_ns() + ns
        while time.thread_time_ns() < end:
            pass
        return backend

    return work


def test_a_threaded_plan_runs_nothing_inline():
    runs = InlineRuns("m:1", THREADED, 8)
    assert not runs.admits(1, 0.0) and runs.as_json()["inline_max_batch"] == 0


def test_sizes_whose_median_overruns_the_budget_go_to_threads_until_the_retry(monkeypatch):
    monkeypatch.setattr(inline_module, "_RETRY_AFTER", 10.0)
    runs, pool = InlineRuns("m:1", INLINE, 8), Pool()
    assert runs.admits(8, 0.0)
    for _ in range(5):  # judged once the window holds five runs
        assert runs.run(pool, 0, _spin(2 * BUDGET_NS), 4, lambda: 100.0) == "backend"
    assert runs.largest == 3 and not runs.admits(4, 105.0) and runs.admits(3, 105.0)
    assert runs.admits(8, 110.0) and runs.largest == 8  # another chance after _RETRY_AFTER
    assert pool.released == [0] * 5


def test_one_slow_run_among_fast_ones_does_not_send_a_size_away():
    runs, pool = InlineRuns("m:1", INLINE, 8), Pool()
    runs.run(pool, 0, _spin(2 * BUDGET_NS), 2, lambda: 0.0)
    for _ in range(6):
        runs.run(pool, 0, _spin(0), 2, lambda: 0.0)
    assert runs.largest == 8


def test_a_backend_that_refuses_the_loop_sends_everything_to_threads_even_when_its_run_fails():
    runs, pool = InlineRuns("m:1", INLINE, 8), Pool()
    pool.refusal = "it called another model"

    def fails(backend):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        runs.run(pool, 1, fails, 1, lambda: 0.0)
    assert pool.released == [1]
    assert runs.largest == 0 and not runs.admits(1, 1e9)
    assert runs.as_json()["execution"] == "threaded" and runs.as_json()["reason"] == "it called another model"
