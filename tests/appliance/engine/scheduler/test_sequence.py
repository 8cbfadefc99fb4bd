"""The sequence batcher through its public API (submit/start/drain/close) with an accumulator backend
that records every batch it runs. Time appears only as sleeps that hold an instance busy and as idle
timeouts that must have passed; nothing asserts how fast anything runs."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from appliance.core.errors import InferenceFailed, InvalidInput, Unavailable
from appliance.engine.scheduler import SequenceScheduler
from appliance.engine.scheduler.execution import ExecutionMode
from appliance.engine.scheduler.sequence import BACKLOG_PER_SLOT, MIN_BACKLOG
from tests.appliance.engine.scheduler.accumulator import Accumulator, sequence_scheduler
from tests.waiting import await_until


@pytest.fixture
def make(started):
    def build(*args, **kwargs) -> SequenceScheduler:
        return started(sequence_scheduler(*args, **kwargs))

    return build


def step(scheduler: SequenceScheduler, corrid, value: int, start: bool = False, end: bool = False,
         batch: int = 1) -> asyncio.Task:
    parameters = {"sequence_id": corrid, "sequence_start": start, "sequence_end": end}
    inputs = {"INPUT": np.full((batch, 1), value, np.int32)}
    return asyncio.ensure_future(scheduler.submit(inputs, ["OUTPUT", "END_OUT"], batch, parameters))


async def run_sequence(scheduler, corrid, values) -> list[int]:
    results = []
    for index, value in enumerate(values):
        out = await step(scheduler, corrid, value, start=index == 0, end=index == len(values) - 1)
        results.append(int(out["OUTPUT"][0, 0]))
    return results


def cumulative(values) -> list[int]:
    return np.cumsum(values).tolist()


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 8 }"])
async def test_interleaved_sequences_each_accumulate_alone(make, strategy):
    backend = Accumulator(delay=0.002)
    scheduler = make(strategy, backend)
    rng = np.random.default_rng(0)
    sequences = {corrid: rng.integers(-50, 50, int(rng.integers(3, 12))).tolist() for corrid in range(1, 9)}
    results = await asyncio.gather(*(run_sequence(scheduler, c, v) for c, v in sequences.items()))
    assert results == [cumulative(v) for v in sequences.values()]
    assert max(len([r for r in b["READY"] if r]) for b in backend.batches) > 1  # sequences did batch together
    assert backend.overlaps == 0


INLINE = ExecutionMode(True, "test", 1_000, 50_000, 1_000_000_000)  # a budget no batch overruns on a busy box


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 8 }"])
async def test_inline_steps_run_on_the_loop_and_each_sequence_still_accumulates_alone(make, strategy):
    backend = Accumulator()
    scheduler = make(strategy, backend, execution=INLINE)
    rng = np.random.default_rng(1)
    sequences = {corrid: rng.integers(-50, 50, int(rng.integers(3, 12))).tolist() for corrid in range(1, 9)}
    results = await asyncio.gather(*(run_sequence(scheduler, c, v) for c, v in sequences.items()))
    assert results == [cumulative(v) for v in sequences.values()]
    assert backend.threads == {threading.get_ident()} and backend.overlaps == 0
    assert max(len([r for r in b["READY"] if r]) for b in backend.batches) > 1  # sequences did batch together
    assert scheduler.execution["execution"] == "inline" and scheduler.execution["inline_max_batch"] == 4


async def test_an_inline_step_that_fails_fails_its_requests_and_the_next_steps_run(make):
    backend = Accumulator(fail_on=7)
    scheduler = make("direct { }", backend, execution=INLINE)
    assert int((await step(scheduler, 3, 5, start=True))["OUTPUT"][0, 0]) == 5
    with pytest.raises(InferenceFailed, match="on purpose"):
        await step(scheduler, 3, 7)
    assert int((await step(scheduler, 3, 1, end=True))["OUTPUT"][0, 0]) == 6  # the failed step kept no state
    assert backend.threads == {threading.get_ident()}


async def test_requests_of_one_sequence_run_in_order_one_at_a_time(make):
    backend = Accumulator(delay=0.002)
    scheduler = make("oldest { max_candidate_sequences: 4 }", backend)
    tasks = [step(scheduler, 5, v, start=i == 0, end=i == 5) for i, v in enumerate([1, 2, 3, 4, 5, 6])]
    outputs = [int(r["OUTPUT"][0, 0]) for r in await asyncio.gather(*tasks)]
    assert outputs == cumulative([1, 2, 3, 4, 5, 6])
    assert len(backend.batches) == 6 and backend.overlaps == 0
    assert [b["START"] for b in backend.batches] == [[1], [0], [0], [0], [0], [0]]
    assert [b["END"] for b in backend.batches] == [[0], [0], [0], [0], [0], [1]]


async def test_direct_keeps_each_sequence_in_its_slot_and_pads_empty_rows(make):
    backend = Accumulator()
    scheduler = make("direct { }", backend)
    await step(scheduler, 11, 1, start=True)  # slot 0
    await step(scheduler, 22, 10, start=True)  # slot 1
    await step(scheduler, 22, 5)  # slot 1 alone: row 0 is padding
    last = backend.batches[-1]
    assert last["READY"] == [0, 1] and last["START"] == [0, 0] and last["CORRID"] == [0, 22]
    assert last["INPUT"] == [0, 5]
    both = await asyncio.gather(step(scheduler, 11, 2), step(scheduler, 22, 1, end=True))
    assert [int(r["OUTPUT"][0, 0]) for r in both] == [3, 16]
    assert backend.batches[-1]["READY"] == [1, 1] and backend.batches[-1]["CORRID"] == [11, 22]


async def test_oldest_batches_only_ready_sequences(make):
    backend = Accumulator(delay=0.01)
    scheduler = make("oldest { max_candidate_sequences: 8 }", backend)
    await asyncio.gather(*(step(scheduler, c, c, start=True) for c in (1, 2, 3)))
    assert all(all(b["READY"]) for b in backend.batches)
    assert sorted(c for b in backend.batches for c in b["CORRID"]) == [1, 2, 3]


@pytest.mark.parametrize("control", ["FP32", "INT32", "BOOL"])
async def test_every_control_form_is_fed_as_its_datatype(make, control):
    backend = Accumulator()
    scheduler = make("direct { }", backend, control=control)
    assert await run_sequence(scheduler, 3, [4, 5, 6]) == [4, 9, 15]
    assert backend.batches[0]["START"] == [True if control == "BOOL" else 1]


async def test_string_ids_reach_the_corrid_control(make):
    backend = Accumulator()
    scheduler = make("oldest { }", backend, corrid="BYTES")
    assert await run_sequence(scheduler, "stream-a", [1, 1]) == [1, 2]
    assert backend.batches[0]["CORRID"] == [b"stream-a"]


async def test_a_new_start_restarts_a_live_sequence(make):
    scheduler = make()
    await step(scheduler, 9, 5, start=True)
    assert int((await step(scheduler, 9, 5))["OUTPUT"][0, 0]) == 10
    assert int((await step(scheduler, 9, 7, start=True))["OUTPUT"][0, 0]) == 7  # no END before: begins again
    assert int((await step(scheduler, 9, 1))["OUTPUT"][0, 0]) == 8
    both = await asyncio.gather(step(scheduler, 9, 3, start=True), step(scheduler, 9, 1, end=True))
    assert [int(r["OUTPUT"][0, 0]) for r in both] == [3, 4]
    assert scheduler.stats.sequences.started == 3 and scheduler.stats.sequences.ended == 1


async def test_protocol_errors_have_tritons_words(make):
    scheduler = make()
    with pytest.raises(InvalidInput, match=r"^inference request for sequence 4 to model 'acc' must specify the "
                                           r"START flag on the first request of the sequence"):
        await step(scheduler, 4, 1)
    with pytest.raises(InvalidInput, match="must specify a non-zero or non-empty correlation ID"):
        await step(scheduler, 0, 1, start=True)
    with pytest.raises(InvalidInput, match="must specify batch-size 1 due to requirements of sequence batcher"):
        await step(scheduler, 4, 1, start=True, batch=2)
    await step(scheduler, 4, 1, start=True, end=True)
    with pytest.raises(InvalidInput, match="already ended"):
        await step(scheduler, 4, 1)
    with pytest.raises(InvalidInput, match="'sequence_start' must be a boolean"):
        await scheduler.submit({"INPUT": np.ones((1, 1), np.int32)}, ["OUTPUT"], 1,
                               {"sequence_id": 3, "sequence_start": "yes"})


async def test_idle_sequences_are_reaped_and_their_slot_reused(make):
    scheduler = make("direct { }", Accumulator(), max_batch_size=1, idle_us=100_000)
    await step(scheduler, 1, 1, start=True)
    await await_until(lambda: scheduler.stats.sequences.reaped == 1, what="the idle sequence reaped")
    with pytest.raises(InvalidInput, match=r"sequence 1 was ended after 100000 us without a request"):
        await step(scheduler, 1, 1)
    assert scheduler.stats.sequences.reaped == 1 and scheduler.stats.sequences.active == 0
    assert await run_sequence(scheduler, 2, [3, 4]) == [3, 7]


async def test_one_reaper_ends_each_sequence_at_its_own_idle_time(make):
    # Sequences that go idle at different times are each ended once idle that long: the one reaper that
    # ends the first looks again for the one a later step kept alive.
    scheduler = make("direct { }", Accumulator(), max_batch_size=2, idle_us=200_000)
    await asyncio.gather(step(scheduler, 1, 1, start=True), step(scheduler, 2, 1, start=True))
    await asyncio.sleep(0.1)
    await step(scheduler, 2, 1)  # sequence 2 idles from here
    await await_until(lambda: scheduler.stats.sequences.reaped == 1, what="sequence 1 reaped")
    assert scheduler.stats.sequences.active == 1
    with pytest.raises(InvalidInput, match=r"sequence 1 was ended after 200000 us without a request"):
        await step(scheduler, 1, 1)
    await await_until(lambda: scheduler.stats.sequences.reaped == 2, what="sequence 2 reaped")
    assert scheduler.stats.sequences.active == 0


async def test_a_step_with_nothing_queued_behind_it_takes_no_further_loop_turn(make, monkeypatch):
    scheduler = make("direct { }", Accumulator(), max_batch_size=1)
    looked = []
    run_lane = scheduler._run_lane
    monkeypatch.setattr(scheduler, "_run_lane", lambda lane: (looked.append(lane.index), run_lane(lane)))
    await step(scheduler, 1, 1, start=True)
    await asyncio.sleep(0.01)  # a kick after the step would have run by now
    assert looked == [0]  # the request's own look at the lane, none after its step


async def test_a_full_batcher_backlogs_then_refuses_new_sequences(make):
    scheduler = make("direct { }", Accumulator(), max_batch_size=1, idle_us=60_000_000)
    await step(scheduler, 1, 1, start=True)  # holds the only slot, never ends
    limit = max(MIN_BACKLOG, BACKLOG_PER_SLOT)
    waiting = [step(scheduler, 100 + i, 1, start=True, end=True) for i in range(limit)]
    await await_until(lambda: scheduler.stats.sequences.backlog == limit, what="the backlog filled")
    assert not any(t.done() for t in waiting) and scheduler.stats.sequences.backlog == limit
    with pytest.raises(Unavailable, match="backlog of 64 sequences is full"):
        await step(scheduler, 999, 1, start=True)
    await step(scheduler, 1, 1, end=True)  # frees the slot: the backlog runs in order
    assert [int(r["OUTPUT"][0, 0]) for r in await asyncio.gather(*waiting)] == [1] * limit
    assert scheduler.stats.sequences.rejected == 1 and scheduler.stats.sequences.backlog == 0


async def test_a_failed_step_fails_its_requests_and_the_sequence_goes_on(make):
    scheduler = make("direct { }", Accumulator(fail_on=13))
    await step(scheduler, 1, 2, start=True)
    with pytest.raises(InferenceFailed, match="on purpose"):
        await step(scheduler, 1, 13)
    assert int((await step(scheduler, 1, 1, end=True))["OUTPUT"][0, 0]) == 3


async def test_preserve_ordering_answers_in_arrival_order(make):
    scheduler = make("oldest { max_candidate_sequences: 4 preserve_ordering: true }", Accumulator(delay=0.005))
    done: list[int] = []
    tasks = [step(scheduler, c, c, start=True, end=True) for c in (1, 2, 3, 4)]
    for corrid, task in zip((1, 2, 3, 4), tasks):
        task.add_done_callback(lambda _, c=corrid: done.append(c))
    await asyncio.gather(*tasks)
    assert done == [1, 2, 3, 4]


async def test_several_instances_each_serve_their_own_sequences(make):
    backends = (Accumulator(delay=0.003), Accumulator(delay=0.003))
    scheduler = make("direct { }", *backends, max_batch_size=2)
    results = await asyncio.gather(*(run_sequence(scheduler, c, [c, 1, 1]) for c in range(1, 5)))
    assert results == [[c, c + 1, c + 2] for c in range(1, 5)]
    seen = [{c for b in backend.batches for c, r in zip(b["CORRID"], b["READY"]) if r} for backend in backends]
    assert seen[0] and seen[1] and not seen[0] & seen[1]


async def test_close_fails_what_is_still_queued(make):
    backend = Accumulator(delay=0.2)
    scheduler = make("direct { }", backend, max_batch_size=1)
    first = step(scheduler, 1, 1, start=True)
    second = step(scheduler, 1, 1)
    await await_until(lambda: backend.batches and scheduler.pending == 1,
                      what="the first step running, the second queued")
    await scheduler.close()
    assert int((await first)["OUTPUT"][0, 0]) == 1
    with pytest.raises(Unavailable, match="unloaded"):
        await second


async def test_a_model_that_does_not_batch_gets_unbatched_control_tensors(make):
    backend = Accumulator()
    scheduler = make("direct { }", backend, max_batch_size=0)
    outputs = []
    for index, value in enumerate([2, 3, 4]):
        parameters = {"sequence_id": 8, "sequence_start": index == 0, "sequence_end": index == 2}
        result = await scheduler.submit({"INPUT": np.array([value], np.int32)}, ["OUTPUT"], 1, parameters)
        outputs.append(result["OUTPUT"].tolist())
    assert outputs == [[2], [5], [9]]
    assert all(b["READY"] == [1] for b in backend.batches)
    assert backend.batches[0]["shapes"] == {"INPUT": (1,), "START": (1,), "END": (1,), "READY": (1,),
                                            "CORRID": (1,), "ACC_IN": (1,)}
