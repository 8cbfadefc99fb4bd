"""The rate limiter under concurrent clients (security finding "High 5"): an instance's resources go back
before the instance can be taken again, so a second client's request never finds the instance free while
its resources are still held ("took its resources twice", then a model hung until reloaded). Every request
is answered or cancelled, and at the end no resource is held and nothing waits.

The backends stand for Python models: a batch is started and its answer comes on the event loop (as the
model process's reply is read there), or it is refused at start; no test sleeps for a fixed time."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from appliance.backends import Backend, BackendRequest
from appliance.backends.base import BatchResult
from appliance.core.errors import InferenceFailed, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.rate_limiter import InstanceNeeds, RateLimitCounts, RateLimiter
from appliance.engine.scheduler import Scheduler, SchedulerPolicy
from appliance.engine.stats import ModelStats
from tests.fakes import RequestsBackend, TensorlessBackend
from tests.waiting import await_until, next_turn


async def _until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "the condition") -> None:
    """Poll ``condition`` on the event loop until it holds, failing after ``timeout`` seconds."""
    await await_until(condition, timeout=timeout, what=what, interval=0.001)


class Remote(TensorlessBackend):
    """An instance whose batches run elsewhere (a model process): ``start_requests`` queues the batch, and
    the test answers it on the event loop, in order, with ``answer``; a batch may also be refused at start
    (the model process is gone), which the pool hands to its waiters at once."""

    inline_safe = False

    def __init__(self, refuse_first: int = 0) -> None:
        self.started: collections.deque[tuple[list[BackendRequest], Callable]] = collections.deque()
        self.executions = 0
        self.refuse = refuse_first

    def run(self, inputs, outputs):  # the instance's thread: never used, every batch starts elsewhere
        raise AssertionError("a Remote batch ran on the instance's thread")

    def start_requests(self, requests, done):
        if self.refuse:
            self.refuse -= 1
            raise InferenceFailed("the model process is gone")
        self.started.append((list(requests), done))
        return True

    def answer(self) -> None:
        """The oldest started batch's reply arrives (call on the event loop's thread)."""
        requests, done = self.started.popleft()
        self.executions += 1
        done(BatchResult([{"y": r.inputs["x"]} for r in requests]))


def _scheduler(limiter: RateLimiter, backends: list[Backend], needs: list[InstanceNeeds], name: str = "m",
               policy: SchedulerPolicy | None = None) -> Scheduler:
    limits = limiter.register(f"{name}:1", needs, RateLimitCounts())
    scheduler = Scheduler(f"{name}:1", InstancePool(f"{name}:1", backends, limits),
                          policy or SchedulerPolicy(max_batch_size=0), ModelStats())
    scheduler.start()
    return scheduler


@pytest.fixture
async def schedulers() -> AsyncIterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for scheduler in made:
        await scheduler.close(timeout=5)


def _submit(scheduler: Scheduler, value: float = 0.0) -> asyncio.Task:
    return asyncio.ensure_future(scheduler.submit({"x": np.full(1, value, np.float32)}, ["y"], 1, {}))


def _idle(limiter: RateLimiter) -> bool:
    return limiter.waiting == 0 and all(r["in_use"] == 0 for r in limiter.resources())


SHARED = [InstanceNeeds(0, (("accelerator", True, 1),))]


async def test_a_second_client_arriving_as_the_first_is_answered_does_not_take_twice(schedulers):
    # The reply of the first request is read on the event loop, and in the same loop iteration a second
    # client's request is queued: the instance was free again before its resources went back, and the
    # second request took them a second time (AssertionError, HTTP 500), leaving the instance lost.
    limiter = RateLimiter()
    backend = Remote()
    schedulers.append(scheduler := _scheduler(limiter, [backend], SHARED))
    first = _submit(scheduler, 1.0)
    await _until(lambda: len(backend.started) == 1, what="the first batch starting")
    asyncio.get_running_loop().call_soon(backend.answer)
    second = _submit(scheduler, 2.0)  # its first step runs right after the answer, in the same iteration
    await _until(lambda: (backend.executions == 1 and len(backend.started) == 1) or second.done(),
                 what="the second batch starting")
    assert not second.done(), second.exception()
    backend.answer()
    assert (await first)["y"].tolist() == [1.0] and (await second)["y"].tolist() == [2.0]
    third = _submit(scheduler, 3.0)  # the model still serves (its instance was not lost)
    await _until(lambda: len(backend.started) == 1, what="the third batch starting")
    backend.answer()
    assert (await third)["y"].tolist() == [3.0]
    assert _idle(limiter) and backend.executions == 3


async def test_a_batch_refused_at_start_gives_its_resources_back_before_the_next_takes_them(schedulers):
    # Two requests batched apart in one flush: the first is refused at start (its waiter gets the error at
    # once, the instance is free at once), and the second must not find the resources still held.
    limiter = RateLimiter()
    backend = Remote(refuse_first=1)
    policy = SchedulerPolicy(max_batch_size=1, dynamic=True)
    schedulers.append(scheduler := _scheduler(limiter, [backend], SHARED, policy=policy))
    first, second = _submit(scheduler, 1.0), _submit(scheduler, 2.0)
    await _until(lambda: len(backend.started) == 1 or second.done(), what="the second batch starting")
    assert not second.done(), second.exception()
    backend.answer()
    with pytest.raises(InferenceFailed, match="the model process is gone"):
        await first
    assert (await second)["y"].tolist() == [2.0]
    assert _idle(limiter)


async def _holder_and_queued_waiter(limiter: RateLimiter):
    """(holder, waiter, waiting): two instances of SHARED, the holder holding it and the waiter's take(0)
    (the future ``waiting``) queued behind it."""
    holder = limiter.register("holder:1", SHARED, RateLimitCounts())
    waiter = limiter.register("waiter:1", SHARED, RateLimitCounts())
    assert holder.try_take(0)
    waiting = asyncio.ensure_future(waiter.take(0))
    await _until(lambda: limiter.waiting == 1, what="the waiter queueing")
    return holder, waiter, waiting


async def test_a_waiter_is_told_when_its_model_is_unloaded():
    # An unloaded model's instance waiting for its resources gets an error, never an endless wait.
    limiter = RateLimiter()
    holder, waiter, waiting = await _holder_and_queued_waiter(limiter)
    waiter.close()
    with pytest.raises(Unavailable, match="unloaded while waiting"):
        await asyncio.wait_for(waiting, 5)
    holder.give_back(0)
    assert _idle(limiter)


async def test_a_cancelled_waiter_gives_back_what_it_was_granted_meanwhile():
    limiter = RateLimiter()
    holder, waiter, waiting = await _holder_and_queued_waiter(limiter)
    waiting.cancel()
    holder.give_back(0)  # granted to the waiter in the same iteration its cancellation lands
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert _idle(limiter)
    assert holder.try_take(0)
    holder.give_back(0)


# -- many clients, several instances, shared resources, random cancellations ----------------------------


class Threaded(RequestsBackend):
    """An instance whose batches run on its own thread (the pool's other path), answering at once."""

    inline_safe = False

    def __init__(self) -> None:
        self.requests = 0

    def run_requests(self, requests):
        self.requests += len(requests)
        return BatchResult([{"y": r.inputs["x"]} for r in requests])


async def _answer_at_random(backends: list[Remote], limiter: RateLimiter, rng: random.Random,
                            stop: asyncio.Event) -> int:
    """Answer started batches in a random order, on the event loop, until ``stop``; check on every step
    that no resource is held beyond its copies. Returns the requests answered."""
    answered = 0
    while not stop.is_set():
        for row in limiter.resources():
            assert 0 <= row["in_use"] <= row["capacity"], row
        busy = [b for b in backends if b.started]
        for backend in rng.sample(busy, len(busy)):
            for _ in range(rng.randint(1, len(backend.started))):
                answered += len(backend.started[0][0])
                backend.answer()
        await next_turn()
    return answered


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_many_clients_under_shared_resources_are_all_answered_and_nothing_stays_held(schedulers, seed):
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    limiter = RateLimiter()
    # Four models, eleven instances on two devices: a global resource most of them share, a per-device one,
    # priorities 1 and 2, batches answered on the loop or on instance threads, one model batching.
    layouts: list[tuple[str, type[Backend], list[InstanceNeeds], SchedulerPolicy]] = [
        ("detector", Remote, [InstanceNeeds(d, (("bus", True, 1), ("dram", False, 2)), 1) for d in (0, 1, 0)],
         SchedulerPolicy(max_batch_size=0)),
        ("classifier", Remote, [InstanceNeeds(d, (("bus", True, 1),), 2) for d in (0, 1)],
         SchedulerPolicy(max_batch_size=4, dynamic=True)),
        ("tracker", Remote, [InstanceNeeds(d, (("dram", False, 1),), 1) for d in (0, 1, 1)],
         SchedulerPolicy(max_batch_size=0)),
        ("embedder", Threaded, [InstanceNeeds(d, (("bus", True, 1), ("dram", False, 1)), 1) for d in (0, 1, 1)],
         SchedulerPolicy(max_batch_size=0)),
    ]
    remotes: list[Remote] = []
    threaded: list[Threaded] = []
    models = []
    for name, kind, needs, policy in layouts:
        backends = [kind() for _ in needs]
        for backend in backends:
            (remotes if isinstance(backend, Remote) else threaded).append(backend)  # type: ignore[arg-type]
        models.append(_scheduler(limiter, backends, needs, name, policy))
    schedulers.extend(models)
    stop = asyncio.Event()
    driver = asyncio.ensure_future(_answer_at_random(remotes, limiter, rng, stop))
    requests = []
    cancelled = set()
    for index in range(400):
        requests.append(request := _submit(rng.choice(models), float(index)))
        if rng.random() < 0.2:  # the client goes away: queued, waiting for resources, or running
            cancelled.add(index)
            loop.call_later(rng.uniform(0, 0.05), request.cancel)
        if index % 10 == 0:
            await next_turn()  # some run while more arrive
    try:
        _, pending = await asyncio.wait(requests, timeout=10)
    finally:
        stop.set()
        answered = await driver
    assert not pending, f"{len(pending)} of {len(requests)} requests were never answered"
    for index, request in enumerate(requests):
        if request.cancelled():
            assert index in cancelled
        else:
            assert request.result()["y"].tolist() == [float(index)]
    answered += sum(b.requests for b in threaded)
    assert answered >= sum(1 for r in requests if not r.cancelled())
    await _until(lambda: _idle(limiter), what="every resource given back and nothing waiting")
    # Every model still serves: no instance was lost on the way.
    driver = asyncio.ensure_future(_answer_at_random(remotes, limiter, rng, stop := asyncio.Event()))
    try:
        results = await asyncio.wait_for(asyncio.gather(*(_submit(model, 7.0) for model in models)), 5)
    finally:
        stop.set()
        await driver
    assert [r["y"].tolist() for r in results] == [[7.0]] * len(models)
    assert _idle(limiter)
