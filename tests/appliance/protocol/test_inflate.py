"""The one inflater of compressed requests (``appliance.protocol.inflate``): the ratio limit and its floor,
the budget counted step by step, and a caller that goes away stopping the worker before its account closes.
Properties over any input are in test_inflate_fuzz.py."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time

import pytest

from appliance.core.errors import PayloadTooLarge, Unavailable
from appliance.protocol import inflate as inflate_module
from appliance.protocol.inflate import RATIO_FLOOR, InflateLimits, inflate, inflate_off_loop
from appliance.security.budget import MemoryBudget
from tests.waiting import await_until

MIB = 1 << 20


def test_the_ratio_refuses_bombs_but_not_small_or_ordinary_data():
    budget = MemoryBudget(1 << 30)
    zeros = gzip.compress(bytes(RATIO_FLOOR), 9)  # ~1000:1, but no more than the floor
    with budget.account() as account:
        assert inflate(zeros, "gzip", InflateLimits(64 * MIB), account) == bytes(RATIO_FLOOR)
    bomb = gzip.compress(bytes(8 * MIB), 9)
    with budget.account() as account, pytest.raises(PayloadTooLarge, match="max_inflation_ratio"):
        inflate(bomb, "gzip", InflateLimits(64 * MIB), account)
    with budget.account() as account:  # 0: no ratio
        assert len(inflate(bomb, "gzip", InflateLimits(64 * MIB, 0), account)) == 8 * MIB
    text = b"".join(b"%d,%d;" % (i, i * i) for i in range(400_000))  # compresses a few times, as data does
    with budget.account() as account:
        assert inflate(gzip.compress(text), "gzip", InflateLimits(64 * MIB), account) == text
    assert budget.used == 0


def test_inflating_past_the_budget_is_refused_with_nothing_left_reserved():
    budget = MemoryBudget(64 * MIB)
    bomb = gzip.compress(bytes(16 * MIB), 9)
    with budget.account() as others, budget.account() as account:
        others.reserve(56 * MIB)  # requests in flight hold most of the budget
        with pytest.raises(Unavailable, match="max_request_memory_bytes"):
            inflate(bomb, "gzip", InflateLimits(64 * MIB, 0), account)
        assert account.held == 0 and budget.used == 56 * MIB
    assert budget.used == 0


class _Watched(MemoryBudget):
    """A budget that notes when anything was reserved last."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.last_reserved = 0.0

    def _take(self, size: int, held: int) -> None:
        super()._take(size, held)
        self.last_reserved = time.monotonic()


def watch_the_worker(monkeypatch) -> threading.Event:
    """An event set once the worker thread's ``inflate`` returns or raises: after it, nothing reserves."""
    ended = threading.Event()
    real = inflate_module.inflate

    def watched(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            ended.set()

    monkeypatch.setattr(inflate_module, "inflate", watched)
    return ended


async def test_a_cancelled_caller_stops_the_worker_before_its_account_closes(monkeypatch):
    worker_ended = watch_the_worker(monkeypatch)
    budget = _Watched(1 << 30)
    bomb = gzip.compress(bytes(256 * MIB), 9)

    async def request() -> None:
        with budget.account() as account:
            await inflate_off_loop(bomb, "gzip", InflateLimits(256 * MIB, 0), account)

    task = asyncio.create_task(request())
    await await_until(lambda: budget.used >= 8 * MIB or task.done(), timeout=10, what="the worker under way",
                      interval=0.005)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ended = time.monotonic()
    assert budget.used == 0

    def worker_gone() -> bool:  # a worker still running would reserve again within a step
        assert budget.used == 0 and budget.last_reserved <= ended
        return worker_ended.is_set()

    await await_until(worker_gone, timeout=30, what="the worker thread to end")
    assert budget.used == 0 and budget.last_reserved <= ended
