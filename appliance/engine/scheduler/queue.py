"""The pending-request queue of one model version: one FIFO per priority level plus the requests
whose queue timeout passed under the DELAY action (served after everything else)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from appliance.engine.scheduler.policy import SchedulerPolicy

if TYPE_CHECKING:
    from appliance.backends.base import BackendRequest
    from appliance.engine.stats import StepTiming
    from appliance.engine.trace import Trace

__all__ = ["Pending", "RequestQueue"]


class Pending:
    """One queued request. A plain class (made for every request): its rarely set fields are class
    attributes until set, which a dataclass's ``__init__``, setting all fifteen, would not allow."""

    timer: asyncio.TimerHandle | None = None
    delayed = False
    queued = False
    completed = False

    def __init__(self, request: BackendRequest, size: int, key: tuple, future: asyncio.Future, arrival: float,
                 level: int, seq: int, trace: Trace | None = None, timing: StepTiming | None = None,
                 then: Callable[[object, BaseException | None], None] | None = None) -> None:
        self.request = request
        """The request as the backend takes it, made as it is queued (while its parts are at hand: the batch
        that runs it only hands it on)."""
        self.size = size
        """Batch items this request carries (``request.size``, read where the batcher counts them)."""
        self.key = key
        """Requests batch together only when their keys (input names and non-batch shapes) are equal."""
        self.future = future
        self.arrival = arrival
        self.level = level
        self.seq = seq
        self.trace = trace
        self.timing = timing
        """Told this request's queue and compute times (an ensemble step's)."""
        self.then = then
        """Called with the request's outputs or error in the step that completes it (``Scheduler.enqueue``),
        instead of ``future`` getting them; ``future`` then only marks it done (or withdrawn)."""
        self.arrival_ns = time.monotonic_ns()
        """For the statistics' queue time: ``arrival`` is the loop's clock, which uvloop advances once per
        iteration (a request dispatched in the iteration it came in would count 0 ns queued)."""


class RequestQueue:
    def __init__(self, policy: SchedulerPolicy) -> None:
        self._policy = policy
        self._levels: list[deque[Pending]] = [deque() for _ in range(policy.levels)]
        self._limits = [policy.queue_policy(level).max_queue_size for level in range(policy.levels)]
        self.bounded = any(limit > 0 for limit in self._limits)
        """Whether any level has a max_queue_size (without one, no level is ever full: nothing to ask)."""
        self._delayed: deque[Pending] = deque()
        self.count = 0
        """Requests queued (``len``; read as an attribute where every request passes: no call)."""
        self.items = 0
        """Batch items across every queued request."""

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Pending]:
        """Pending requests in the order they should run: by priority, then arrival; delayed last."""
        for level in self._levels:
            yield from level
        yield from self._delayed

    def head(self, count: int) -> list[Pending]:
        """The first ``count`` requests in ``__iter__``'s order (the common queue, one level and nothing
        delayed, without a generator's steps)."""
        first = self._levels[0]
        if len(first) >= count or (len(self._levels) == 1 and not self._delayed):
            return list(itertools.islice(first, count))
        return list(itertools.islice(self, count))

    def level_full(self, level: int) -> bool:
        limit = self._limits[level]
        return limit > 0 and len(self._levels[level]) >= limit

    def push(self, pending: Pending) -> None:
        self._levels[pending.level].append(pending)
        pending.queued = True
        self.count += 1
        self.items += pending.size

    def remove(self, pending: Pending) -> bool:
        """Take a request out wherever it is; False if it was not queued."""
        if not pending.queued:
            return False
        (self._delayed if pending.delayed else self._levels[pending.level]).remove(pending)
        pending.queued = False
        self.count -= 1
        self.items -= pending.size
        if pending.timer is not None:
            pending.timer.cancel()
            pending.timer = None
        return True

    def take(self, batch: list[Pending]) -> None:
        """Take out a batch the batcher formed (queued requests, each once): ``remove`` for each, in one
        step, a request at the head of its queue popped (a batch is its queue's oldest, in order)."""
        items = 0
        for pending in batch:
            queue = self._delayed if pending.delayed else self._levels[pending.level]
            if queue[0] is pending:
                queue.popleft()
            else:
                queue.remove(pending)
            pending.queued = False
            items += pending.size
            if pending.timer is not None:
                pending.timer.cancel()
                pending.timer = None
        self.count -= len(batch)
        self.items -= items

    def delay(self, pending: Pending) -> None:
        """Move a request whose timeout passed behind every request still in time."""
        if pending.queued and not pending.delayed:
            self._levels[pending.level].remove(pending)
            pending.delayed = True
            self._delayed.append(pending)
