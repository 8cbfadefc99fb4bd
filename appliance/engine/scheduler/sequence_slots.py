"""Where each live sequence runs: a lane per model instance, each with a fixed number of places (direct:
one batch slot per ``max_batch_size`` row, in a fixed position; oldest: ``max_candidate_sequences``), and a
bounded backlog of started sequences waiting for a place, served first come, first served.

Pure bookkeeping, on the event loop: the scheduler (appliance.engine.scheduler.sequence) decides when a
lane runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.backends.base import not_cancelled

if TYPE_CHECKING:
    from appliance.backends.base import ResponseSink
    from appliance.engine.stats import StepTiming
    from appliance.engine.trace import Trace

__all__ = ["Lane", "Row", "Sequence", "SequenceRequest", "SlotTable"]


@dataclasses.dataclass(eq=False, slots=True)
class SequenceRequest:
    """One accepted request of a sequence, waiting for (or in) its execution."""

    inputs: Mapping[str, np.ndarray]
    outputs: tuple[str, ...]
    parameters: Mapping[str, object]
    flags: int
    future: asyncio.Future
    arrival: float
    key: tuple
    """Requests run in one batch only when their keys (input names and shapes, state shapes) match."""
    order: int
    trace: Trace | None = None
    timing: StepTiming | None = None
    request_id: str = ""
    completed: bool = False
    sink: ResponseSink | None = None
    """A decoupled model's request: where its responses go, whichever step sends them."""
    cancelled: Callable[[], bool] = not_cancelled
    again: bool = False
    """The model released it with RESCHEDULE (an iterative sequence): it is queued to run again."""
    arrival_ns: int = dataclasses.field(default_factory=time.monotonic_ns)
    """For the statistics' queue time (``arrival`` is the loop's clock: see queue.Pending)."""
    then: Callable[[Any, BaseException | None], None] | None = None
    """Called with the outputs or error in the step that completes the request (``enqueue``), instead of
    ``future`` getting them (see queue.Pending.then)."""


@dataclasses.dataclass(eq=False, slots=True)
class Sequence:
    corrid: int | str
    queue: deque[SequenceRequest] = dataclasses.field(default_factory=deque)
    state: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Implicit state, keyed by the model input that takes it; empty until the first step ran."""
    lane: int | None = None
    slot: int | None = None
    running: bool = False
    ending: bool = False
    """The last request queued carries END: only a new START may follow it."""
    idle_since: float | None = None
    """When its last step ended with nothing queued (the loop's clock): the scheduler's one reaper
    ends it once ``max_sequence_idle_microseconds`` have passed since; None while it has work."""


Row = tuple[Sequence, SequenceRequest]
"""One sequence's request in a step's batch (a slot with no request is None)."""


@dataclasses.dataclass(eq=False, slots=True)
class Lane:
    """One model instance and the sequences placed on it."""

    index: int
    places: list[Sequence | None]
    busy: bool = False
    scheduled: bool = False
    timer: asyncio.TimerHandle | None = None

    @property
    def occupied(self) -> int:
        return sum(1 for s in self.places if s is not None)

    def ready(self) -> list[Sequence]:
        """Its sequences ready for a step, in place order: placed, with a request queued and none running."""
        return [s for s in self.places if s is not None and s.queue and not s.running and s.lane is not None]


class SlotTable:
    def __init__(self, instances: int, places_per_lane: int, backlog_limit: int) -> None:
        self.lanes = [Lane(i, [None] * places_per_lane) for i in range(instances)]
        self.backlog: deque[Sequence] = deque()
        self.backlog_limit = backlog_limit

    @property
    def capacity(self) -> int:
        return sum(len(lane.places) for lane in self.lanes)

    def place(self, sequence: Sequence) -> bool:
        """Give ``sequence`` the first free place of the emptiest lane; False when every place is taken."""
        lane = max(self.lanes, key=lambda lane: (len(lane.places) - lane.occupied, -lane.index))
        if lane.occupied == len(lane.places):
            return False
        slot = lane.places.index(None)
        lane.places[slot] = sequence
        sequence.lane, sequence.slot = lane.index, slot
        return True

    def enqueue(self, sequence: Sequence) -> bool:
        """Place the sequence, or queue it in the backlog; False when the backlog is full too."""
        if self.place(sequence):
            return True
        if len(self.backlog) >= self.backlog_limit:
            return False
        self.backlog.append(sequence)
        return True

    def remove(self, sequence: Sequence) -> list[Sequence]:
        """Take the sequence out of its place (or the backlog); returns backlogged sequences that got the
        freed place."""
        if sequence.lane is None:
            try:
                self.backlog.remove(sequence)
            except ValueError:
                pass
            return []
        self.lanes[sequence.lane].places[sequence.slot or 0] = None
        sequence.lane = sequence.slot = None
        promoted = []
        while self.backlog and self.place(self.backlog[0]):
            promoted.append(self.backlog.popleft())
        return promoted
