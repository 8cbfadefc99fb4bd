"""The pending-request queue: a batch taken out in one step leaves the queue as removing each would."""

from __future__ import annotations

import asyncio

from appliance.backends.base import BackendRequest
from appliance.engine.scheduler.policy import QueuePolicy, SchedulerPolicy
from appliance.engine.scheduler.queue import Pending, RequestQueue


def _pending(loop: asyncio.AbstractEventLoop, level: int, size: int = 1) -> Pending:
    return Pending(BackendRequest({}, (), {}, size), size, (), loop.create_future(), 0.0, level, 0)


def test_a_batch_taken_out_leaves_the_rest_in_order_and_counts_right():
    loop = asyncio.new_event_loop()
    try:
        queue = RequestQueue(SchedulerPolicy(max_batch_size=8, priority_levels=2))
        first, second, third = (_pending(loop, 0, size) for size in (1, 2, 3))
        low, late = _pending(loop, 1), _pending(loop, 1)
        for pending in (first, second, third, low, late):
            queue.push(pending)
        queue.delay(late)
        handle = first.timer = loop.call_later(60, lambda: None)
        queue.take([first, second])
        assert list(queue) == [third, low, late] and len(queue) == 3 and queue.items == 5
        assert not first.queued and not second.queued and first.timer is None and handle.cancelled()
        queue.take([low, late])  # a level's head, then the delayed one
        assert list(queue) == [third] and queue.items == 3
        behind = _pending(loop, 0)
        queue.push(behind)
        queue.take([behind])  # behind its level's head: taken from where it is
        assert list(queue) == [third] and queue.items == 3
        queue.take([third])
        assert not queue and queue.items == 0 and not queue.remove(third)
    finally:
        loop.close()


def test_the_head_is_the_first_requests_in_the_order_they_run():
    loop = asyncio.new_event_loop()
    try:
        one = RequestQueue(SchedulerPolicy(max_batch_size=8))
        assert one.head(3) == [] and one.count == 0
        alone = [_pending(loop, 0) for _ in range(4)]
        for pending in alone:
            one.push(pending)
        assert one.head(3) == alone[:3] and one.head(8) == alone and one.count == 4
        levels = RequestQueue(SchedulerPolicy(max_batch_size=8, priority_levels=2))
        high, low, late, later = _pending(loop, 0), _pending(loop, 1), _pending(loop, 0), _pending(loop, 1)
        for pending in (high, low, late, later):
            levels.push(pending)
        levels.delay(late)
        assert levels.head(1) == [high]  # the first level holds enough
        assert levels.head(3) == [high, low, later] == list(levels)[:3]
        assert levels.head(9) == list(levels) == [high, low, later, late]
    finally:
        loop.close()


def test_a_queue_without_a_max_queue_size_is_unbounded_and_never_full():
    loop = asyncio.new_event_loop()
    try:
        free = RequestQueue(SchedulerPolicy(max_batch_size=8))
        for _ in range(50):
            free.push(_pending(loop, 0))
        assert not free.bounded and not free.level_full(0)
        bounded = RequestQueue(SchedulerPolicy(max_batch_size=8, default_queue_policy=QueuePolicy(max_queue_size=2)))
        assert bounded.bounded and not bounded.level_full(0)
        bounded.push(_pending(loop, 0))
        bounded.push(_pending(loop, 0))
        assert bounded.level_full(0)
    finally:
        loop.close()
