"""``SequenceScheduler.enqueue`` and ``withdraw``: the straight line's way onto a sequence (no task
waits; a callback is told the outcome), with test_sequence.py's accumulator, as test_enqueue.py tests
the batching scheduler's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.engine.scheduler import SequenceScheduler
from tests.appliance.engine.scheduler.accumulator import Accumulator, sequence_scheduler
from tests.appliance.engine.scheduler.told import Told
from tests.waiting import await_until


@pytest.fixture
def make(started):
    def build(*args, **kwargs) -> SequenceScheduler:
        return started(sequence_scheduler(*args, **kwargs))

    return build


def _enqueue(scheduler: SequenceScheduler, told: Told, corrid: int, value: int, start: bool = False,
             end: bool = False):
    parameters = {"sequence_id": corrid, "sequence_start": start, "sequence_end": end}
    return scheduler.enqueue({"INPUT": np.full((1, 1), value, np.int32)}, ["OUTPUT"], 1, parameters, told.then)


async def test_each_step_is_told_its_outputs_and_the_sequence_accumulates(make):
    scheduler = make()
    told = Told("OUTPUT", int)
    _enqueue(scheduler, told, 7, 1, start=True)
    _enqueue(scheduler, told, 7, 2)
    _enqueue(scheduler, told, 7, 3, end=True)
    assert told.outcomes == []  # nothing runs in the step that queued them
    await await_until(lambda: len(told.outcomes) == 3, what="three answers")
    assert told.outcomes == [(1, None), (3, None), (6, None)]
    assert scheduler.counts.started == 1 and scheduler.counts.ended == 1
    assert scheduler.pending == 0


async def test_a_refused_step_raises_where_it_is_enqueued_and_is_not_told(make):
    scheduler = make()
    told = Told("OUTPUT", int)
    with pytest.raises(InvalidInput, match="must specify the START flag"):
        _enqueue(scheduler, told, 9, 1)
    await asyncio.sleep(0.05)
    assert told.outcomes == [] and scheduler.pending == 0


async def test_a_withdrawn_step_still_runs_for_its_sequence_but_is_not_told(make):
    backend = Accumulator(delay=0.1)
    scheduler = make("direct { }", backend)
    told = Told("OUTPUT", int)
    _enqueue(scheduler, told, 5, 10, start=True)
    await await_until(lambda: backend.batches, what="the first step running")
    withdrawn = _enqueue(scheduler, told, 5, 20)
    assert scheduler.withdraw(withdrawn)
    assert not scheduler.withdraw(withdrawn)  # once
    _enqueue(scheduler, told, 5, 30, end=True)
    await await_until(lambda: len(told.outcomes) == 2, what="the first and last answers")
    await asyncio.sleep(0.05)
    # The withdrawn step ran: the last one sees its 20 in the sum.
    assert told.outcomes == [(10, None), (60, None)]
    assert [b["INPUT"][0] for b in backend.batches] == [10, 20, 30]


async def test_a_step_answered_already_is_not_withdrawn(make):
    scheduler = make()
    told = Told("OUTPUT", int)
    answered = _enqueue(scheduler, told, 3, 4, start=True, end=True)
    await await_until(lambda: told.outcomes, what="the answer")
    assert not scheduler.withdraw(answered)
    assert told.outcomes == [(4, None)]
