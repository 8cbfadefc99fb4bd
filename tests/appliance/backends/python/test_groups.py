"""Groups: several requests of a model without dynamic batching in one message to its process, each run
by its own execute() there, in order; a request whose execute() raises fails alone."""

from __future__ import annotations

import asyncio

import numpy as np

from appliance.backends.base import BackendRequest, BatchResult
from appliance.core.errors import InferenceFailed
from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config

MODEL = "backends/one_at_a_time"
"""OUT = IN + 1; SEEN = (how many requests this execute() got, how many executions so far); IN[0] == -1
raises; its config "queued" has each execute() sleep first (so that concurrent requests queue)."""
CONFIG = read_config(MODEL)


def _request(*values: float) -> BackendRequest:
    return BackendRequest({"IN": np.asarray(values, dtype=np.float32)}, ("OUT", "SEEN"))


async def _each(backend, requests) -> BatchResult:
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    assert backend.start_each(requests, lambda result: loop.call_soon_threadsafe(done.set_result, result))
    return await asyncio.wait_for(done, 30)


def test_a_group_runs_execute_once_per_request_in_order(tmp_path):
    model = copy_model(tmp_path, MODEL, "one")

    async def scenario(backend):
        assert backend.group_limit > 1
        result = await _each(backend, [_request(i, 10 * i) for i in range(5)])
        assert result.failed == frozenset()
        for i, outputs in enumerate(result.results):
            assert np.array_equal(outputs["OUT"], [i + 1, 10 * i + 1])
            assert outputs["SEEN"].tolist() == [1, i + 1]  # alone, and in the order sent

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))


def test_a_request_whose_execute_raises_fails_alone(tmp_path):
    model = copy_model(tmp_path, MODEL, "one")

    async def scenario(backend):
        result = await _each(backend, [_request(1, 1), _request(-1, 0), _request(3, 3)])
        assert result.failed == frozenset({1})
        assert np.array_equal(result.results[0]["OUT"], [2, 2])
        assert np.array_equal(result.results[2]["OUT"], [4, 4])
        error = result.results[1]
        assert isinstance(error, InferenceFailed)
        assert str(error).startswith(
            "Failed to process the request(s) for model 'one_0_0', message: ValueError: minus one")
        # the process goes on: a batch after the group is answered as usual
        again = await _each(backend, [_request(5, 5), _request(6, 6)])
        assert [r["OUT"].tolist() for r in again.results] == [[6, 6], [7, 7]]

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))


def test_a_decoupled_model_is_never_grouped(tmp_path):
    config = read_config(MODEL, "decoupled")
    model = copy_model(tmp_path, MODEL, "one", config="decoupled")
    with loaded(model, config) as backend:
        assert backend.group_limit == 1


def test_a_group_starts_from_the_loop_when_each_request_is_small(tmp_path):
    model = copy_model(tmp_path, MODEL, "one")
    each = np.arange(8192, dtype=np.float32)  # 32 KiB: four together are more than a batch copies on the loop

    async def scenario(backend):
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        requests = [BackendRequest({"IN": each + i}, ("OUT", "SEEN")) for i in range(4)]
        assert not backend.start_requests(requests, done.set_result)  # as one batch: too much for the loop
        assert backend.start_each(requests, lambda result: loop.call_soon_threadsafe(done.set_result, result))
        result = await asyncio.wait_for(done, 30)
        assert [r["OUT"][0] for r in result.results] == [1, 2, 3, 4]

    with loaded(model, CONFIG) as backend:
        asyncio.run(scenario(backend))
