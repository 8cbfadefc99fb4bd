"""The instance pool through its public API, with backends that sleep or raise (no wall-clock asserts)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from appliance.backends import Backend
from appliance.core.instances import InstancePool


class Recorder(Backend):
    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.active = 0
        self.max_active = 0
        self.calls = 0
        self.closed = False
        self._lock = threading.Lock()

    def inputs(self):
        return []

    def outputs(self):
        return []

    def run(self, inputs, outputs):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls += 1
        try:
            time.sleep(self.delay)
            if self.fail:
                raise RuntimeError("backend exploded")
            return {"y": inputs["x"] * 2}
        finally:
            with self._lock:
                self.active -= 1

    def close(self):
        self.closed = True


async def test_instances_run_concurrently_but_each_alone():
    backends = [Recorder(delay=0.05), Recorder(delay=0.05)]
    pool = InstancePool("m", backends)
    pool.start()
    results = await asyncio.gather(*(pool.run({"x": np.array([i])}, ["y"]) for i in range(8)))
    assert [int(r["y"][0]) for r in results] == [2 * i for i in range(8)]
    assert all(b.max_active == 1 for b in backends)  # never two threads in one instance
    assert sum(b.calls for b in backends) == 8
    assert all(b.calls > 0 for b in backends)  # both instances took work
    pool.close()
    assert all(b.closed for b in backends)


async def test_errors_reach_the_waiter_and_the_instance_is_freed():
    backend = Recorder(fail=True)
    pool = InstancePool("m", [backend])
    pool.start()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="exploded"):
            await pool.run({"x": np.array([1])}, ["y"])
    assert pool.idle == 1
    pool.close()


async def test_cancelled_waiter_does_not_free_a_busy_instance():
    backend = Recorder(delay=0.2)
    pool = InstancePool("m", [backend])
    pool.start()
    first = asyncio.create_task(pool.run({"x": np.array([1])}, ["y"]))
    await asyncio.sleep(0.05)  # the first request is now executing
    first.cancel()
    second = asyncio.create_task(pool.run({"x": np.array([2])}, ["y"]))
    result = await second
    assert int(result["y"][0]) == 4
    assert backend.max_active == 1
    assert await pool.drain(timeout=5)
    pool.close()
