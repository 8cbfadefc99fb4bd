"""The batch cap selection measured (SchedulerPolicy.batch_cap): batches the scheduler forms hold no more
items, a single request larger than the cap still runs whole."""

from __future__ import annotations

import asyncio

import numpy as np

from appliance.engine.instances import InstancePool
from appliance.engine.scheduler import Scheduler, SchedulerPolicy
from appliance.engine.stats import ModelStats
from tests.fakes import FakeBackend
from tests.waiting import await_until


async def test_batches_stop_at_the_cap_and_a_larger_request_runs_whole(started):
    backend = FakeBackend(delay=0.1)
    policy = SchedulerPolicy(max_batch_size=8, dynamic=True, batch_cap=2)
    scheduler = started(Scheduler("m:1", InstancePool("m:1", [backend]), policy, ModelStats()))

    def submit(rows: int) -> asyncio.Task:
        return asyncio.ensure_future(scheduler.submit({"x": np.ones((rows, 1), np.float32)}, ["y"], rows, {}))

    first = submit(1)
    await await_until(lambda: backend.batches, what="the first batch running")
    rest = [submit(1) for _ in range(5)] + [submit(6)]
    await asyncio.wait_for(asyncio.gather(first, *rest), 30)
    assert backend.batch_sizes == [1, 2, 2, 1, 6]
