"""Two batches on their way to one model process at once (pipeline_depth 2): the second is sent while
the first runs, each gets its own answers (inputs and outputs in arenas taken in turn), a process that
dies fails both, and a model with no dynamic batching is lent twice per instance by its pool."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

from appliance.backends.base import BackendRequest, BatchResult
from appliance.core.errors import InferenceFailed
from appliance.engine.instances import InstancePool
from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config
from tests.waiting import open_gate

MODEL = "backends/slow_plus_one"
"""Sleeps (in ms) as long as its first input says, returns its input + 1; -1 ends the process once the test
opens the gate (exit.fifo in the model's directory)."""
CONFIG = read_config(MODEL)


def _request(*values: float) -> BackendRequest:
    return BackendRequest({"IN": np.asarray([values], dtype=np.float32)}, ("OUT",))


async def _started(backend, requests) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    assert backend.start_requests(requests, lambda result: loop.call_soon_threadsafe(done.set_result, result))
    return done


def test_batches_sent_while_one_runs_each_get_their_own_answers(tmp_path):
    model = copy_model(tmp_path, MODEL, "slow")

    async def scenario(backend):
        assert backend.pipeline_depth == 2
        await asyncio.wait_for(await _started(backend, [_request(0)]), 30)  # hands the channel to the loop
        for round_ in range(5):
            started = time.monotonic()
            first = await _started(backend, [_request(150, round_), _request(1, 2 * round_)])
            second = await _started(backend, [_request(0, 3 * round_, 7)])  # sent while the first sleeps
            one, two = await asyncio.wait_for(asyncio.gather(first, second), 30)
            assert time.monotonic() - started >= 0.15
            assert np.array_equal(one.results[0]["OUT"], [[151, round_ + 1]])
            assert np.array_equal(one.results[1]["OUT"], [[2, 2 * round_ + 1]])
            assert np.array_equal(two.results[0]["OUT"], [[1, 3 * round_ + 1, 8]])

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))


def test_a_process_that_dies_fails_both_batches_on_their_way(tmp_path):
    model = copy_model(tmp_path, MODEL, "slow")
    gate = tmp_path / "slow" / "exit.fifo"
    os.mkfifo(gate)

    async def scenario(backend):
        await asyncio.wait_for(await _started(backend, [_request(0)]), 30)
        first = await _started(backend, [_request(-1)])  # ends its process once the gate opens: the
        second = await _started(backend, [_request(0)])  # second batch is on its way before that
        await asyncio.to_thread(open_gate, gate)
        for future in (first, second):
            result = await asyncio.wait_for(future, 30)
            assert isinstance(result, BatchResult)
            assert isinstance(result.results[0], InferenceFailed) and "exited with code 5" in str(result.results[0])
        (outputs,) = (await asyncio.to_thread(backend.run_requests, [_request(0, 1)])).results  # restarted
        assert np.array_equal(outputs["OUT"], [[1, 2]])

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))


def test_a_pool_of_depth_two_lends_each_instance_twice(tmp_path):
    model = copy_model(tmp_path, MODEL, "slow")

    async def scenario(backend):
        pool = InstancePool("slow", [backend], depth=backend.pipeline_depth)
        pool.start()
        try:
            assert [await pool.acquire(), await pool.acquire()] == [0, 0]
            assert pool.try_acquire() is None
            pool.release(0)
            pool.release(0)
            assert pool.idle == 2
        finally:
            await asyncio.to_thread(pool.close, 5)

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))
