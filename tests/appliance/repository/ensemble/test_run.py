"""The parts of one ensemble request's run that need no model: Triton's shared per-step limit
(``max_inflight_requests``) and the sequence a tensor carries."""

from __future__ import annotations

import asyncio

from appliance.repository.ensemble.plan import Step
from appliance.repository.ensemble.run import SequenceTag, StepSlots
from tests.waiting import next_turn

STEP = Step(1, "slow", None, {"x": "IN"}, {"y": "OUT"})


async def test_a_step_runs_at_most_max_inflight_requests_at_once_across_requests():
    slots = StepSlots("e", 2)
    assert await slots.acquire(STEP) and await slots.acquire(STEP)
    third = asyncio.create_task(slots.acquire(STEP))
    await next_turn(10)  # far more turns than an acquire with a free slot takes to end
    assert not third.done()  # both slots taken: it waits
    slots.release(STEP)
    assert await asyncio.wait_for(third, 1)


async def test_a_step_that_waits_too_long_goes_ahead_as_triton_does(caplog):
    slots = StepSlots("e", 1, patience=0.1)
    assert await slots.acquire(STEP)
    assert not await asyncio.wait_for(slots.acquire(STEP), 5)  # ran without a slot (nothing to give back)
    assert "running it anyway to avoid a deadlock" in caplog.text


async def test_without_a_limit_nothing_waits():
    slots = StepSlots("e", 0)
    assert not any([await slots.acquire(STEP) for _ in range(100)])


def test_a_response_naming_its_sequence_overrides_the_request_flags_as_triton_does():
    request = SequenceTag.of({"sequence_id": 7, "sequence_start": True})
    assert request == SequenceTag(7, True, False)
    # Triton: a response that sets any of the three starts from no flags and keeps the request's ID
    assert SequenceTag.of({"sequence_end": True}, request) == SequenceTag(7, False, True)
    assert SequenceTag.of({"sequence_id": "abc"}, request).parameters() == {
        "sequence_id": "abc", "sequence_start": False, "sequence_end": False}
    assert SequenceTag.of({}) == SequenceTag(0, False, False)
