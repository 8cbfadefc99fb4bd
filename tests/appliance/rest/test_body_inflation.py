"""Compressed REST bodies through the shared inflater (``appliance.protocol.inflate``, as gRPC messages):
refused past max_inflation_ratio, and a request that goes away while its body inflates leaves nothing
reserved (its worker thread used to go on reserving on the account the request had closed)."""

from __future__ import annotations

import asyncio
import gzip
from unittest import mock

import pytest
from aiohttp import streams
from aiohttp.test_utils import make_mocked_request

from appliance.core.errors import PayloadTooLarge
from appliance.rest.body import BodyLimits, read_body
from appliance.security.budget import MemoryBudget
from tests.appliance.protocol.test_inflate import watch_the_worker
from tests.waiting import await_until

MIB = 1 << 20


def _gzip_request(body: bytes):
    protocol = mock.Mock(_reading_paused=False)
    reader = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    reader.feed_data(body)
    reader.feed_eof()
    return make_mocked_request("POST", "/v2/models/m/infer", headers={"Content-Encoding": "gzip"}, payload=reader)


async def test_a_body_past_the_inflation_ratio_is_413_before_it_is_inflated_whole():
    budget = MemoryBudget(1 << 30)
    bomb = gzip.compress(bytes(64 * MIB), 9)  # ~1000:1
    with budget.account() as account, pytest.raises(PayloadTooLarge, match="max_inflation_ratio"):
        await read_body(_gzip_request(bomb), account, BodyLimits(256 * MIB, 5.0, 200))
    with budget.account() as account:
        assert len(await read_body(_gzip_request(bomb), account, BodyLimits(256 * MIB, 5.0, 0))) == 64 * MIB
    assert budget.used == 0


async def test_a_request_that_goes_away_while_its_body_inflates_leaves_nothing_reserved(monkeypatch):
    worker_ended = watch_the_worker(monkeypatch)
    budget = MemoryBudget(1 << 30)
    bomb = gzip.compress(bytes(256 * MIB), 9)

    async def request() -> None:
        with budget.account() as account:
            await read_body(_gzip_request(bomb), account, BodyLimits(256 * MIB, 5.0, 0))

    task = asyncio.create_task(request())
    await await_until(lambda: budget.used >= 8 * MIB or task.done(), timeout=10, what="the body inflating",
                      interval=0.005)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    def worker_gone() -> bool:  # a worker still running would reserve again within a step
        assert budget.used == 0
        return worker_ended.is_set()

    await await_until(worker_gone, timeout=30, what="the worker thread to end")
    assert budget.used == 0
