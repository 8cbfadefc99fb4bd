"""Inline execution: the choice from measurements, and a scheduler that runs batches on the event loop
(on the loop's thread, results and failures reaching every waiter, falling back to threads for batches
whose runs overrun the budget)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import appliance.engine.scheduler.inline as inline_module
from appliance.core.errors import InferenceFailed
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler import Scheduler, SchedulerPolicy
from appliance.engine.scheduler.execution import (
    GIL_BUDGET_NS,
    INLINE_BUDGET_NS,
    THREADED,
    ExecutionMode,
    choose_execution,
    measure_thread_hop,
    plan_batch_ns,
)
from appliance.engine.stats import ModelStats
from tests.fakes import FakeBackend
from tests.waiting import await_until

INLINE = ExecutionMode(True, "test", 1_000, 50_000, 200_000)


class ThreadRecorder(FakeBackend):
    """Records the thread each batch ran on."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threads: list[int] = []

    def run(self, inputs, outputs):
        self.threads.append(threading.get_ident())
        return super().run(inputs, outputs)


class BusyRecorder(ThreadRecorder):
    """Spins for 2 ms of CPU on batches of ``busy_rows`` rows or more."""

    def __init__(self, busy_rows: int) -> None:
        super().__init__()
        self.busy_rows = busy_rows

    def run(self, inputs, outputs):
        if len(inputs["x"]) >= self.busy_rows:
            end = time.thread_time_ns() + 2_000_000
            while time.thread_time_ns() < end:
                pass
        return super().run(inputs, outputs)


@pytest.fixture
def make_scheduler(started):
    def make(backend: FakeBackend, execution: ExecutionMode, max_batch_size: int = 4) -> Scheduler:
        policy = SchedulerPolicy(max_batch_size=max_batch_size, dynamic=True)
        return started(Scheduler("m:1", InstancePool("m:1", [backend]), policy, ModelStats(), execution))

    return make


def _submit(scheduler: Scheduler, value: float, rows: int = 1) -> asyncio.Future:
    x = {"x": np.full((rows, 1), value, np.float32)}
    return asyncio.ensure_future(scheduler.submit(x, ["y"], rows, {}))


@pytest.mark.parametrize(("batch_ns", "hop_ns", "in_process", "inline", "why"), [
    (10_000, 90_000, True, True, "less than the hop"),
    (120_000, 90_000, True, False, "costs more than the hop"),
    (250_000, 400_000, True, False, "longer than the event loop may block"),
    (10_000, 90_000, False, False, "another process"),
    (None, 90_000, True, False, "not measured"),
    (10_000, 0, True, False, "hop was not measured"),
])
def test_choice_follows_the_measurements(batch_ns, hop_ns, in_process, inline, why):
    mode = choose_execution(batch_ns, hop_ns, in_process)
    assert mode.inline is inline and why in mode.reason
    assert mode.as_json()["execution"] == ("inline" if inline else "threaded")


@pytest.mark.parametrize(("batch_ns", "hop_ns", "inline", "why"), [
    (120_000, 90_000, True, "under the GIL"),  # longer than the hop: a thread would not run it beside the loop
    (120_000, 0, True, "under the GIL"),
    # Over the 200 µs budget of other batches, within the GIL's 1 ms: a thread would block the loop as long.
    (600_000, 90_000, True, "under the GIL"),
    (1_200_000, 90_000, False, "longer than the event loop may block (1000 µs)"),
    (None, 90_000, False, "not measured"),
])
def test_a_batch_under_the_gil_is_judged_by_the_budget_alone(batch_ns, hop_ns, inline, why):
    mode = choose_execution(batch_ns, hop_ns, True, holds_gil=True)
    assert mode.inline is inline and why in mode.reason
    assert mode.budget_ns == GIL_BUDGET_NS
    assert choose_execution(batch_ns, hop_ns, True).budget_ns == INLINE_BUDGET_NS


def test_a_backend_says_why_it_is_not_inline_safe():
    mode = choose_execution(10_000, 90_000, False, holds_gil=True, unsafe_reason="it calls other models")
    assert not mode.inline and mode.reason == "it calls other models"


def test_batch_latency_comes_from_the_chosen_measured_plan():
    decision = {"status": "measured", "chosen": "b", "candidates": [
        {"plan": "a", "latency_ms": 1.0}, {"plan": "b", "latency_ms": 0.012}]}
    assert plan_batch_ns(decision) == 12_000
    assert plan_batch_ns({**decision, "status": "only_plan"}) is None
    assert plan_batch_ns(None) is None
    assert plan_batch_ns({**decision, "candidates": [{"plan": "b", "latency_ms": None}]}) is None


async def test_the_hop_is_measured_on_the_running_loop():
    assert await measure_thread_hop(rounds=20) > 0


async def test_inline_batches_run_on_the_loop_thread_and_split_back(make_scheduler):
    backend = ThreadRecorder()
    scheduler = make_scheduler(backend, INLINE)
    results = await asyncio.gather(*(_submit(scheduler, float(i)) for i in range(6)))
    assert [float(r["y"][0, 0]) for r in results] == [2.0 * i for i in range(6)]
    assert set(backend.threads) == {threading.get_ident()}
    assert backend.batch_sizes == [4, 2]  # requests of one loop iteration still batch together
    assert scheduler.stats.execution_count == 2 and scheduler.stats.inference_count == 6
    assert scheduler.execution["execution"] == "inline"


async def test_threaded_batches_stay_off_the_loop_thread(make_scheduler):
    backend = ThreadRecorder()
    scheduler = make_scheduler(backend, THREADED)
    await asyncio.gather(*(_submit(scheduler, float(i)) for i in range(3)))
    assert threading.get_ident() not in backend.threads
    assert scheduler.execution["inline_max_batch"] == 0


async def test_an_inline_failure_reaches_every_waiter(make_scheduler):
    scheduler = make_scheduler(FakeBackend(fail="boom"), INLINE)
    results = await asyncio.gather(*(_submit(scheduler, 1.0) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, InferenceFailed) and "boom" in r.message for r in results)
    # The instance was released: the next request runs.
    scheduler_ok = make_scheduler(FakeBackend(), INLINE)
    assert float((await _submit(scheduler_ok, 2.0))["y"][0, 0]) == 4.0


async def test_a_batch_over_the_budget_sends_that_size_back_to_threads(make_scheduler):
    # Batches of 3 or more rows compute past the 200 µs budget (CPU time: a sleep would not count);
    # smaller ones are instant.
    backend = BusyRecorder(busy_rows=3)
    scheduler = make_scheduler(backend, INLINE)
    for _ in range(5):  # judged on the median of a few runs: one could be the OS preempting the loop
        await _submit(scheduler, 1.0, rows=3)
    assert backend.threads == [threading.get_ident()] * 5
    assert scheduler.execution["inline_max_batch"] == 2
    await _submit(scheduler, 1.0, rows=3)
    await _submit(scheduler, 1.0, rows=2)
    assert backend.threads[5] != threading.get_ident()
    assert backend.threads[6] == threading.get_ident()


async def test_sizes_sent_back_to_threads_get_another_chance(make_scheduler, monkeypatch):
    monkeypatch.setattr(inline_module, "_RETRY_AFTER", 0.0)  # the chance comes with the next batch
    backend = BusyRecorder(busy_rows=3)
    scheduler = make_scheduler(backend, INLINE)
    for _ in range(5):
        await _submit(scheduler, 1.0, rows=3)
    assert scheduler.execution["inline_max_batch"] == 2
    await _submit(scheduler, 1.0, rows=1)  # the next batch, _RETRY_AFTER later: every size inline again
    assert scheduler.execution["inline_max_batch"] == 4
    assert backend.threads[-1] == threading.get_ident()


async def test_a_request_cancelled_before_its_batch_forms_never_runs(make_scheduler):
    backend = ThreadRecorder()
    scheduler = make_scheduler(backend, INLINE)
    first = _submit(scheduler, 1.0)
    # the first request now waits one iteration for company
    await await_until(lambda: scheduler.pending == 1, interval=0, what="the first request queued")
    others = [_submit(scheduler, float(i)) for i in (2, 3)]
    first.cancel()
    results = await asyncio.gather(*others)
    assert [float(r["y"][0, 0]) for r in results] == [4.0, 6.0]
    assert backend.batches == [[2.0, 3.0]]
    assert first.cancelled()


class TurnsUnsafe(ThreadRecorder):
    """Finds out in its second batch that it must not run on the event loop (as an in-process Python model
    that called another model from there)."""

    def run(self, inputs, outputs):
        result = super().run(inputs, outputs)
        if len(self.threads) == 2:
            self.inline_safe = False
            self.inline_refusal = "it called another model"
        return result


async def test_a_backend_that_turns_unsafe_runs_every_later_batch_on_its_thread(make_scheduler):
    backend = TurnsUnsafe()
    scheduler = make_scheduler(backend, INLINE)
    for value in range(4):
        assert float((await _submit(scheduler, float(value)))["y"][0, 0]) == 2.0 * value
    loop_thread = threading.get_ident()
    assert backend.threads[:2] == [loop_thread, loop_thread]
    assert loop_thread not in backend.threads[2:]
    assert scheduler.execution["execution"] == "threaded"
    assert scheduler.execution["reason"] == "it called another model"
    assert scheduler.execution["inline_max_batch"] == 0
