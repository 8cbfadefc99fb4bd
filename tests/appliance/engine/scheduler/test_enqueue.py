"""``Scheduler.enqueue`` and ``withdraw``: the straight line's way into the queue (no task waits; a
callback is told the outcome), with sleeping fake backends, as test_scheduler.py tests ``submit``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.core.errors import InferenceFailed, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler import QueuePolicy, Scheduler, SchedulerPolicy
from appliance.engine.scheduler.execution import ExecutionMode
from appliance.engine.stats import ModelStats
from tests.appliance.engine.scheduler.told import Told
from tests.fakes import FakeBackend
from tests.waiting import await_until


@pytest.fixture
def make_scheduler(started):
    def make(policy: SchedulerPolicy, backend: FakeBackend) -> Scheduler:
        return started(Scheduler("m:1", InstancePool("m:1", [backend]), policy, ModelStats()))

    return make


def _enqueue(scheduler: Scheduler, value: float, told: Told, **parameters):
    return scheduler.enqueue({"x": np.full((1, 1), value, np.float32)}, ["y"], 1, parameters, told.then)


_ONE_AT_A_TIME = SchedulerPolicy(max_batch_size=1)


async def _one_running(make_scheduler, policy: SchedulerPolicy = _ONE_AT_A_TIME):
    """A scheduler whose one instance runs a request (x = 1) for 0.2 s, and what that request is told."""
    backend = FakeBackend(delay=0.2)
    scheduler = make_scheduler(policy, backend)
    told = Told("y", float)
    _enqueue(scheduler, 1.0, told)
    await await_until(lambda: backend.batches, what="the first request running")
    return backend, scheduler, told


async def test_each_request_is_told_its_outputs_in_the_step_that_completes_it(make_scheduler):
    backend = FakeBackend(delay=0.01)
    scheduler = make_scheduler(SchedulerPolicy(max_batch_size=4, dynamic=True), backend)
    told = Told("y", float)
    for value in (1.0, 2.0, 3.0):
        _enqueue(scheduler, value, told)
    assert told.outcomes == []  # nothing runs in the step that queued them
    await await_until(lambda: len(told.outcomes) == 3, what="three answers")
    assert told.outcomes == [(2.0, None), (4.0, None), (6.0, None)]
    assert backend.batch_sizes == [3]  # queued in one step: one batch
    assert scheduler.stats.inference_count == 3


async def test_a_request_withdrawn_while_queued_never_runs_and_is_not_told(make_scheduler):
    backend, scheduler, told = await _one_running(make_scheduler)
    queued = _enqueue(scheduler, 2.0, told)
    assert scheduler.withdraw(queued)
    assert not scheduler.withdraw(queued)  # once
    await await_until(lambda: told.outcomes, what="the first answer")
    await asyncio.sleep(0.3)
    assert told.outcomes == [(2.0, None)]
    assert backend.batches == [[1.0]]
    assert scheduler.pending == 0


async def test_a_request_withdrawn_while_running_reads_as_cancelled_and_is_not_told(make_scheduler):
    backend = FakeBackend(delay=0.2)
    scheduler = make_scheduler(SchedulerPolicy(max_batch_size=1), backend)
    told = Told("y", float)
    running = _enqueue(scheduler, 1.0, told)
    await await_until(lambda: backend.batches, what="the request running")
    assert scheduler.withdraw(running)
    assert running.future.cancelled()  # what the model's is_cancelled() reads
    after = Told("y", float)
    _enqueue(scheduler, 2.0, after)  # the instance is free again once the batch returns
    await await_until(lambda: after.outcomes, what="the next request's answer")
    assert told.outcomes == []


async def test_withdrawing_an_answered_request_does_nothing(make_scheduler):
    scheduler = make_scheduler(SchedulerPolicy(max_batch_size=1), FakeBackend())
    told = Told("y", float)
    pending = _enqueue(scheduler, 1.0, told)
    await await_until(lambda: told.outcomes, what="the answer")
    assert not scheduler.withdraw(pending)
    assert told.outcomes == [(2.0, None)]


async def test_a_failed_batch_tells_each_request_its_error(make_scheduler):
    scheduler = make_scheduler(SchedulerPolicy(max_batch_size=4, dynamic=True), FakeBackend(fail="broken"))
    told = Told("y", float)
    _enqueue(scheduler, 1.0, told)
    _enqueue(scheduler, 2.0, told)
    await await_until(lambda: len(told.outcomes) == 2, what="both errors")
    assert all(value is None and isinstance(error, InferenceFailed) and "broken" in str(error)
               for value, error in told.outcomes)


async def test_a_full_queue_refuses_in_the_step_that_enqueues(make_scheduler):
    policy = SchedulerPolicy(max_batch_size=1, dynamic=True, default_queue_policy=QueuePolicy(max_queue_size=1))
    _, scheduler, told = await _one_running(make_scheduler, policy)
    _enqueue(scheduler, 2.0, told)
    with pytest.raises(Unavailable, match="max_queue_size 1"):
        _enqueue(scheduler, 3.0, told)
    await await_until(lambda: len(told.outcomes) == 2, what="both answers")


async def test_an_answer_that_raises_leaves_the_rest_of_its_batch_answered(make_scheduler, caplog):
    scheduler = make_scheduler(SchedulerPolicy(max_batch_size=4, dynamic=True), FakeBackend(delay=0.01))
    told = Told("y", float)

    def broken(results, error) -> None:
        raise RuntimeError("answer writer broke")

    scheduler.enqueue({"x": np.full((1, 1), 1.0, np.float32)}, ["y"], 1, {}, broken)
    _enqueue(scheduler, 2.0, told)
    await await_until(lambda: told.outcomes, what="the second answer")
    assert told.outcomes == [(4.0, None)]
    assert "answering a request failed" in caplog.text


async def test_requests_still_queued_at_close_are_told_the_model_was_unloaded(make_scheduler):
    _, scheduler, told = await _one_running(make_scheduler)
    _enqueue(scheduler, 2.0, told)
    await scheduler.close()
    assert any(isinstance(error, Unavailable) and "unloaded" in str(error) for _, error in told.outcomes)


async def test_a_request_enqueued_from_an_inline_answer_waits_for_the_next_step(started):
    """A pipelining client's next request, enqueued as the last one is answered by a batch run on the
    loop, must not run in the same flush: one connection would hold the loop for its whole pipeline."""
    inline = ExecutionMode(True, "test", 1_000, 50_000, 10_000_000)
    backend = FakeBackend()
    scheduler = started(Scheduler("m:1", InstancePool("m:1", [backend]), SchedulerPolicy(max_batch_size=1),
                                  ModelStats(), execution=inline))
    loop = asyncio.get_running_loop()
    steps: list[float] = []
    told = Told("y", float)

    def then(results, error) -> None:
        told.then(results, error)
        steps.append(loop.time())
        if len(told.outcomes) < 3:  # the next request of the pipeline, enqueued from this answer
            scheduler.enqueue({"x": np.full((1, 1), 1.0, np.float32)}, ["y"], 1, {}, then)

    scheduler.enqueue({"x": np.full((1, 1), 1.0, np.float32)}, ["y"], 1, {}, then)
    ticks = 0
    while len(told.outcomes) < 3 and ticks < 100:
        await asyncio.sleep(0)
        ticks += 1
    assert told.outcomes == [(2.0, None)] * 3
    assert backend.batch_sizes == [1, 1, 1]
    assert ticks >= 3  # one answer a step, not the whole pipeline in one
