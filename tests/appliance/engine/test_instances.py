"""The instance pool through its public API, with backends that sleep or raise."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.engine.instances import InstancePool
from tests.fakes import FakeBackend
from tests.waiting import await_until


def _double(backend):
    return backend.run({"x": np.array([[1.0]])}, ["y"])


@pytest.fixture
def make_pool():
    """make_pool(backends) -> InstancePool; every pool's threads are stopped after the test."""
    pools: list[InstancePool] = []

    def make(backends) -> InstancePool:
        pools.append(InstancePool("m", backends))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close(timeout=5)


async def test_each_instance_runs_on_its_own_thread_one_job_at_a_time(make_pool):
    shared = FakeBackend.shared_counter()
    backends = [FakeBackend(delay=0.05, counter=shared), FakeBackend(delay=0.05, counter=shared)]
    pool = make_pool(backends)
    pool.start()

    async def one():
        index = await pool.acquire()
        return await pool.execute(index, _double)

    results = await asyncio.gather(*(one() for _ in range(6)))
    assert all(r["y"][0, 0] == 2.0 for r in results)
    assert all(b.max_active == 1 for b in backends)  # never two threads in one instance
    assert shared.max_active == 2  # but the two instances overlapped
    pool.close()
    assert all(b.closed for b in backends)


async def test_errors_reach_the_waiter_and_the_instance_is_freed(make_pool):
    pool = make_pool([FakeBackend(fail="exploded")])
    pool.start()
    for _ in range(3):
        index = await pool.acquire()
        with pytest.raises(RuntimeError, match="exploded"):
            await pool.execute(index, _double)
    assert pool.idle == 1


async def test_cancelled_waiter_does_not_free_a_busy_instance(make_pool):
    backend = FakeBackend(delay=0.2)
    pool = make_pool([backend])
    pool.start()
    index = await pool.acquire()
    first = asyncio.ensure_future(pool.execute(index, _double))
    await await_until(lambda: backend.batches, what="the batch running on its thread")
    first.cancel()
    assert pool.try_acquire() is None  # still running on its thread
    index = await pool.acquire()
    await pool.execute(index, _double)
    assert backend.max_active == 1
    assert await pool.drain(timeout=5)


async def test_close_with_a_timeout_leaves_a_busy_instance_running(make_pool):
    busy, idle = FakeBackend(delay=1.5), FakeBackend()
    pool = make_pool([busy, idle])
    pool.start()
    index = await pool.acquire()
    assert index == 0
    running = pool.execute(index, _double)
    await await_until(lambda: busy.batches, what="the batch running on its thread")
    started = asyncio.get_running_loop().time()
    errors = await asyncio.to_thread(pool.close, 0.1)
    assert asyncio.get_running_loop().time() - started < 1.0  # 10x its timeout, not the 1.5 s the batch takes
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError) and "m#0" in str(errors[0])
    assert idle.closed and not busy.closed  # a runtime is never closed under a running call
    await running  # the batch still ends well (and before this test's loop closes)
    assert await asyncio.to_thread(pool.close, 5) == [] and busy.closed  # a second close closes the rest


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_batch_that_ends_after_its_loop_closed_is_dropped_quietly(make_pool):
    backend = FakeBackend(delay=0.3)
    pool = make_pool([backend])
    loop = asyncio.new_event_loop()

    async def start_and_leave() -> None:
        pool.start()
        pool.execute(await pool.acquire(), _double)

    loop.run_until_complete(start_and_leave())
    loop.close()  # as when the daemon stops without waiting for a stuck batch
    errors = pool.close(timeout=5)
    assert errors == [] and backend.closed


async def test_work_started_elsewhere_completes_from_another_thread_and_frees_the_instance(make_pool):
    import threading

    pool = make_pool([FakeBackend()])
    pool.start()

    def start(backend, finished):
        threading.Thread(target=finished, args=("done", None)).start()
        return True

    index = await pool.acquire()
    future = pool.begin(index, start)
    assert future is not None
    assert await future == "done"
    assert pool.idle == 1


async def test_work_that_cannot_start_elsewhere_leaves_the_instance_acquired(make_pool):
    pool = make_pool([FakeBackend()])
    pool.start()
    index = await pool.acquire()
    assert pool.begin(index, lambda backend, finished: False) is None
    assert pool.idle == 0
    assert np.array_equal((await pool.execute(index, _double))["y"], [[2.0]])
    assert pool.idle == 1


async def test_work_that_fails_to_start_reaches_the_waiter_and_frees_the_instance(make_pool):
    pool = make_pool([FakeBackend()])
    pool.start()

    def start(backend, finished):
        raise RuntimeError("no")

    future = pool.begin(await pool.acquire(), start)
    assert future is not None
    with pytest.raises(RuntimeError, match="no"):
        await future
    assert pool.idle == 1


async def test_then_gets_a_batch_in_the_step_that_finishes_it_before_the_instance_is_free(make_pool):
    """Read on the loop (a model process's reply), a batch's ``then`` runs inside that very callback, before
    the instance is released; an error reaches it as one, and no future is left unretrieved."""
    pool = make_pool([FakeBackend()])
    pool.start()
    loop = asyncio.get_running_loop()
    seen: list[tuple[object, object, int]] = []
    finish: list = []

    def start(backend, finished):
        finish.append(finished)
        return True

    def then(result, error):
        seen.append((result, error, pool.idle))

    index = await pool.acquire()
    assert pool.start_elsewhere(index, start, then)
    await asyncio.sleep(0)
    finish[0]("done", None)  # on the loop's thread, as the loop reads a reply
    assert seen == [("done", None, 0)] and pool.idle == 1

    failure = RuntimeError("no")
    index = await pool.acquire()
    assert pool.start_elsewhere(index, start, then)
    await asyncio.sleep(0)
    loop.call_soon(finish[1], None, failure)
    await await_until(lambda: len(seen) == 2, timeout=5)
    assert seen[1] == (None, failure, 0) and pool.idle == 1


async def test_run_hands_a_thread_s_result_to_then_on_the_loop(make_pool):
    pool = make_pool([FakeBackend()])
    pool.start()
    got: list = []
    pool.run(await pool.acquire(), _double, lambda result, error: got.append((result, error)))
    await await_until(lambda: got, timeout=10)
    assert np.array_equal(got[0][0]["y"], [[2.0]]) and got[0][1] is None
    assert pool.idle == 1


async def test_waiters_for_a_free_instance_get_it_in_order_and_a_cancelled_one_passes_it_on(make_pool):
    pool = make_pool([FakeBackend()])
    pool.start()
    held = await pool.acquire()
    first = asyncio.ensure_future(pool.acquire())
    second = asyncio.ensure_future(pool.acquire())
    third = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    pool.release(held)  # wakes the first waiter, which is cancelled before it runs
    first.cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert first.cancelled()
    assert second.done() and second.result() == held  # the wake-up went on to the next in line
    assert not third.done() and pool.idle == 0
    pool.release(second.result())
    assert await asyncio.wait_for(third, 1) == held
    assert pool.try_acquire() is None
    pool.release(held)
    assert pool.try_acquire() == held
