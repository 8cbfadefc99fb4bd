"""Batches a Python model runs when started from the event loop (``start_requests``): the loop sends
them and reads the replies itself; large inputs, and a model process that must be restarted, go through
the instance thread (``run_requests``)."""

from __future__ import annotations

import asyncio

import numpy as np

from appliance.backends.base import BackendRequest, BatchResult
from appliance.core.errors import InferenceFailed
from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config

MODEL = "backends/double_or_exit"
"""Doubles its input; an input whose first element is -1 ends the process in the middle of execute()."""
CONFIG = read_config(MODEL)


async def _start(backend, requests) -> BatchResult | BaseException | None:
    """The batch through start_requests, as the scheduler starts it; None if the backend declined."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    if not backend.start_requests(requests, lambda result: loop.call_soon_threadsafe(done.set_result, result)):
        return None
    return await asyncio.wait_for(done, 30)


def _request(values) -> BackendRequest:
    return BackendRequest({"IN": np.asarray([values], dtype=np.float32)}, ("OUT",))


def test_small_batches_run_from_the_loop_and_large_inputs_through_the_thread(tmp_path):
    model = copy_model(tmp_path, MODEL, "double")

    async def scenario(backend):
        for round_ in range(20):  # the first hands the channel over to the loop; the rest read on it
            result = await _start(backend, [_request([1.0, round_]), _request([2.0])])
            assert isinstance(result, BatchResult)
            assert np.array_equal(result.results[0]["OUT"], [[2.0, 2.0 * round_]])
            assert np.array_equal(result.results[1]["OUT"], [[4.0]])
        large = _request(np.ones(1 << 16))
        assert await _start(backend, [large]) is None  # copied on the instance thread instead
        (outputs,) = (await asyncio.to_thread(backend.run_requests, [large])).results
        assert outputs["OUT"].shape == (1, 1 << 16) and float(outputs["OUT"].max()) == 2.0

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))


def test_a_process_that_dies_in_a_started_batch_fails_it_and_is_restarted_for_the_next(tmp_path):
    model = copy_model(tmp_path, MODEL, "double")

    async def scenario(backend):
        assert isinstance(await _start(backend, [_request([1.0])]), BatchResult)
        result = await _start(backend, [_request([-1.0]), _request([5.0])])
        assert isinstance(result, BatchResult)
        assert all(isinstance(r, InferenceFailed) and "exited with code 3" in str(r) for r in result.results)
        assert await _start(backend, [_request([1.0])]) is None  # a restart blocks: the thread does it
        (outputs,) = (await asyncio.to_thread(backend.run_requests, [_request([3.0])])).results
        assert np.array_equal(outputs["OUT"], [[6.0]])
        started = await _start(backend, [_request([4.0])])  # the new process: from the loop again
        assert isinstance(started, BatchResult) and np.array_equal(started.results[0]["OUT"], [[8.0]])

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))
