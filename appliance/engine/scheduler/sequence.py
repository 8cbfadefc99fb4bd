"""Triton's sequence batcher: the scheduler of a model with ``sequence_batching``.

Every request names its sequence (correlation ID, START/END flags: see correlation). A sequence is
placed on one instance for its whole life (sequence_slots); its requests run in arrival order, one at a
time. When an instance is free it runs one batch of the ready sequences placed on it:

- direct: every sequence owns one batch slot (a row); the batch holds rows 0..n, an empty row gets READY
  false and zeros. It runs once ``minimum_slot_utilization`` of the slots are ready, or when the oldest
  ready request has waited ``max_queue_delay_microseconds``.
- oldest: the oldest ready request of each of up to ``max_batch_size`` sequences, as the dynamic batcher
  would batch them (``preferred_batch_size``, ``max_queue_delay_microseconds``, ``preserve_ordering``).

The batcher adds the control tensors and the implicit state to each row (state) and keeps each
sequence's new state from its outputs. A sequence with nothing queued for ``max_sequence_idle_microseconds``
is ended and its slot given to the backlog. Memory stays bounded whatever clients do: the slots, a
backlog of at most ``BACKLOG_PER_SLOT`` sequences per slot (beyond it a new sequence gets 503), at most
``MAX_QUEUED_PER_SEQUENCE`` requests queued per sequence, and a bounded record of ended IDs (for the
error a late request gets).

A request once accepted runs even if its client goes away: skipping it would change the state every
later request of its sequence sees.

A decoupled model's requests send their responses to their sinks; a step ends when the backend's
``run_requests`` returns (responses may follow), and the sequence's next request may then run.

``iterative_sequence`` (Triton's iterative scheduling, e.g. a model that makes one token per step): a
request without a sequence ID starts a sequence of its own (a fresh ID, START). After each step the model
either releases the request with RESCHEDULE, and it is queued again on its sequence (neither START nor
END, its state kept) to run in a later batch beside new and other rescheduled requests (continuous
batching), or completes it, which ends the sequence and frees its slot for the backlog. A request whose
client went away is not run again.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.backends.base import Outputs, RequestResult, Reschedule, ResponseSink, not_cancelled, reschedule_refused
from appliance.core.errors import ApplianceError, InferenceFailed, InvalidInput, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler.completion import Answers, answer_later, mark_compute
from appliance.engine.scheduler.correlation import END, START, SequenceIds, sequence_ids
from appliance.engine.scheduler.execution import ExecutionMode, execute_batch, run_batch
from appliance.engine.scheduler.inline import InlineRuns
from appliance.engine.scheduler.sequence_policy import SequencePolicy
from appliance.engine.scheduler.sequence_slots import Lane, Row, Sequence, SequenceRequest, SlotTable
from appliance.engine.scheduler.state import initial_states, step_requests
from appliance.engine.stats import ModelStats, SequenceCounts, StepTiming

if TYPE_CHECKING:
    from appliance.engine.trace import Trace

__all__ = ["BACKLOG_PER_SLOT", "MAX_QUEUED_PER_SEQUENCE", "SequenceScheduler"]

# A step waits for the one before it and carries state, which the scheduler keeps on the loop whichever
# way a batch runs: on an instance thread, started from the loop in a model process (see _dispatch), or
# inline on the loop where the plan is measured cheap enough (engine/scheduler/inline.py).
THREADED_SEQUENCES = ExecutionMode(False, "a sequence model's batches run on instance threads")

log = logging.getLogger(__name__)

BACKLOG_PER_SLOT = 4
MIN_BACKLOG = 64
MAX_QUEUED_PER_SEQUENCE = 256
MAX_REMEMBERED_ENDS = 4096
TIMER_SLACK = 0.001
"""uvloop's timers keep milliseconds, so one may fire up to this much before its time."""

class SequenceScheduler:
    takes_straight = True
    """``ModelVersion.begin`` queues requests here with ``enqueue`` (see model.StraightScheduler)."""

    def __init__(self, label: str, model: str, pool: InstancePool, policy: SequencePolicy,
                 stats: ModelStats, execution: ExecutionMode = THREADED_SEQUENCES) -> None:
        self.label = label
        self.pool = pool
        self.policy = policy
        self.stats = stats
        self.counts = stats.sequences = SequenceCounts()
        self._model = model
        places = policy.slots_per_instance
        self._table = SlotTable(pool.size, places, max(MIN_BACKLOG, BACKLOG_PER_SLOT * places * pool.size))
        self._sequences: dict[int | str, Sequence] = {}
        self._ended: OrderedDict[int | str, str] = OrderedDict()
        """Recently ended IDs and how they ended, so a late request learns why its sequence is gone."""
        self._order = itertools.count()
        self._answers: Answers[SequenceRequest] = Answers(policy.preserve_ordering, lambda request: request.order)
        self._queued = 0
        self._in_flight = 0
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._initial_shapes = tuple((name, value.shape) for name, value in initial_states(policy).items())
        self._waiting: set[int] = set()
        """Lanes waiting in the rate limiter for their instance's resources."""
        self._granted: set[int] = set()
        """Lanes holding their instance's resources, about to dispatch."""
        self._fresh_ids = itertools.count(1)
        self._reaper: asyncio.TimerHandle | None = None
        """The one timer that ends idle sequences (``_reap``): at the earliest moment one may be due, rather
        than a timer per sequence set and cancelled at every step."""
        self._inline = InlineRuns(label, execution, policy.max_batch_size)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.pool.start()

    @property
    def pending(self) -> int:
        return self._queued

    @property
    def execution(self) -> dict[str, Any]:
        """Where batches run (inline or threaded), why, and the largest batch still run inline."""
        return self._inline.as_json()

    async def drain(self, timeout: float) -> bool:
        self._closing = True
        return await self.pool.drain(timeout, busy=lambda: bool(self._queued or self._in_flight))

    async def close(self, timeout: float | None = None) -> list[BaseException]:
        self._closing = True
        gone = Unavailable(f"model {self.label} was unloaded before this request ran")
        for lane in self._table.lanes:
            if lane.timer is not None:
                lane.timer.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for sequence in list(self._sequences.values()):
            while sequence.queue:
                self._queued -= 1
                self._complete(sequence.queue.popleft(), None, gone)
        self._sequences.clear()
        return await asyncio.to_thread(self.pool.close, timeout)

    # -- the request side --------------------------------------------------------------------

    async def submit(self, inputs: Mapping[str, np.ndarray], outputs: Iterable[str], batch_size: int,
                     parameters: Mapping[str, Any], trace: Trace | None = None,
                     timing: StepTiming | None = None, request_id: str = "", sink: ResponseSink | None = None,
                     cancelled: Callable[[], bool] | None = None) -> dict[str, np.ndarray]:
        """Queue one validated request on its sequence and wait for its outputs (a decoupled model's: until
        its step ran; its responses go to ``sink``). An accepted request runs even if its client goes away
        (``cancelled`` is not consulted, except before an iterative request runs again): later steps
        need its state."""
        request = self._accept(inputs, outputs, batch_size, parameters, trace, timing, request_id, sink, cancelled,
                               None)
        return await request.future

    def enqueue(self, inputs: Mapping[str, np.ndarray], outputs: Iterable[str], batch_size: int,
                parameters: Mapping[str, Any], then: Callable[[Any, BaseException | None], None],
                trace: Trace | None = None, request_id: str = "", timing: StepTiming | None = None) -> SequenceRequest:
        """``submit`` without a task waiting (as ``Scheduler.enqueue``): queue one validated request on its
        sequence; ``then(outputs, error)`` is called in the step that completes it. ``withdraw`` takes
        its answer back, not its step."""
        return self._accept(inputs, outputs, batch_size, parameters, trace, timing, request_id, None, None, then)

    @staticmethod
    def withdraw(request: SequenceRequest) -> bool:
        """Its client went away: the request still runs (its sequence's later steps need the state it
        leaves) but is not answered; True unless it had its answer already."""
        return request.future.cancel()

    def _accept(self, inputs: Mapping[str, np.ndarray], outputs: Iterable[str], batch_size: int,
                parameters: Mapping[str, Any], trace: Trace | None, timing: StepTiming | None, request_id: str,
                sink: ResponseSink | None, cancelled: Callable[[], bool] | None,
                then: Callable[[Any, BaseException | None], None] | None) -> SequenceRequest:
        """A new request queued on its sequence (its lane looked at one loop iteration later), or refused."""
        loop = self._loop
        assert loop is not None, "SequenceScheduler.start() was not called"
        if self._closing:
            raise Unavailable(f"model {self.label} is unloading", retry_after=1)
        ids = self._ids(parameters)
        if self.policy.batched and batch_size != 1:
            raise InvalidInput(
                f"inference request to model '{self._model}' must specify batch-size 1 due to requirements of "
                f"sequence batcher; got {batch_size}: send one step of the sequence per request"
            )
        sequence = self._sequences.get(ids.corrid)
        if not ids.start and (sequence is None or sequence.ending):
            raise InvalidInput(self._no_start(ids.corrid, sequence is not None))
        if sequence is None:
            sequence = self._open(ids.corrid)
        elif ids.start:
            # Triton's behaviour: a START on a live sequence begins it again in the same slot (state reset).
            log.debug("model %s: sequence %r restarted by a new START", self.label, ids.corrid)
        if len(sequence.queue) >= MAX_QUEUED_PER_SEQUENCE:
            raise Unavailable(
                f"sequence {ids.corrid} of model '{self._model}' has {MAX_QUEUED_PER_SEQUENCE} requests queued; "
                "wait for answers before sending more", retry_after=1,
            )
        sequence.idle_since = None
        if len(inputs) == 1:  # (the common request: one input)
            ((name, array),) = inputs.items()
            key: tuple = ((name, array.shape),)
        else:
            key = tuple(sorted((name, array.shape) for name, array in inputs.items()))
        request = SequenceRequest(inputs, tuple(outputs), parameters, ids.flags, loop.create_future(), loop.time(),
                                  key, next(self._order), trace, timing, request_id, sink=sink,
                                  cancelled=cancelled or not_cancelled, then=then)
        if trace is not None:
            trace.mark("QUEUE_START")
        sequence.queue.append(request)
        sequence.ending = ids.end
        self._queued += 1
        if ids.start:
            self.counts.started += 1
        if sequence.lane is not None:
            self._kick(self._table.lanes[sequence.lane])
        return request

    def _ids(self, parameters: Mapping[str, Any]) -> SequenceIds:
        """The request's sequence; under iterative_sequence, one of its own when it names none."""
        corrid = parameters.get("sequence_id", 0)
        if self.policy.iterative and (corrid == "" or (type(corrid) is int and corrid == 0)):
            return SequenceIds(self._fresh_id(), START)
        return sequence_ids(parameters, self._model, self.policy.corrid)

    def _fresh_id(self) -> int | str:
        """The next ID no live sequence holds (Triton's iterative sequencer counts from 1), a string when
        the model's CORRID control takes strings."""
        as_text = self.policy.corrid is not None and self.policy.corrid.datatype == "BYTES"
        while True:
            number = next(self._fresh_ids)
            corrid: int | str = str(number) if as_text else number
            if corrid not in self._sequences:
                return corrid

    def _open(self, corrid: int | str) -> Sequence:
        sequence = Sequence(corrid)
        if not self._table.enqueue(sequence):
            self.counts.rejected += 1
            raise Unavailable(
                f"model '{self._model}' has no free sequence slot and its backlog of "
                f"{self._table.backlog_limit} sequences is full; end sequences (sequence_end) or retry later",
                retry_after=1,
            )
        self._sequences[corrid] = sequence
        self._ended.pop(corrid, None)
        self._count_places()
        return sequence

    def _no_start(self, corrid: int | str, ending: bool) -> str:
        message = (f"inference request for sequence {corrid} to model '{self._model}' must specify the START flag "
                   "on the first request of the sequence")
        how = "its last request carried END" if ending else self._ended.get(corrid)
        if how is None:
            return message + "; send sequence_start: true to begin it"
        return message + f"; sequence {corrid} {how}: send sequence_start: true to begin it again"

    # -- batching ----------------------------------------------------------------------------

    def _kick(self, lane: Lane) -> None:
        """Look at the lane one loop iteration later: requests arriving together run together."""
        if not lane.scheduled:
            lane.scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._run_lane, lane)

    def _on_delay(self, lane: Lane) -> None:
        lane.timer = None
        self._run_lane(lane)

    def _key(self, sequence: Sequence) -> tuple:
        """What must match for two sequences' next requests to share a batch: input and state shapes."""
        request = sequence.queue[0]
        if request.flags & START or not sequence.state:
            return request.key, self._initial_shapes
        return request.key, tuple((name, value.shape) for name, value in sequence.state.items())

    def _run_lane(self, lane: Lane) -> None:
        lane.scheduled = False
        if lane.busy:
            return  # its batch's end looks again
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        ready = lane.ready()
        if not ready:
            self._give_back(lane, executed=False)
            return
        policy = self.policy
        if len(ready) == 1:  # (the common step at low load: no order to sort, no key to match)
            oldest = ready[0]
            chosen = ready
        else:
            ready.sort(key=lambda s: s.queue[0].order)
            oldest = ready[0]
            key = self._key(oldest)
            chosen = [s for s in ready if self._key(s) == key]
        if policy.strategy == "direct":
            # (no max(): it parses keywords on every call)
            target = math.ceil(policy.minimum_slot_utilization * len(lane.places)) or 1
        else:
            chosen = chosen[:max(policy.max_batch_size, 1)]
            target = policy.preferred_batch_sizes[-1] if policy.preferred_batch_sizes else max(policy.max_batch_size, 1)
        if len(chosen) < target:
            assert self._loop is not None
            due = oldest.queue[0].arrival + policy.max_queue_delay
            if due > self._loop.time():
                lane.timer = self._loop.call_at(due, self._on_delay, lane)
                return
            fitting = [p for p in policy.preferred_batch_sizes if p <= len(chosen)]
            if fitting:
                chosen = chosen[:fitting[-1]]
        self._dispatch(lane, chosen)

    def _dispatch(self, lane: Lane, chosen: list[Sequence]) -> None:
        assert self._loop is not None
        # The pool counts idle instances; which one runs is this lane's (each lane is one instance).
        token = self.pool.try_acquire()
        if token is None:  # cannot happen while lanes track their instance; look again when one frees
            self._loop.call_later(0.001, self._kick, lane)
            return
        limits = self.pool.limits
        if limits is not None and lane.index not in self._granted and (
                lane.index in self._waiting or not limits.try_take(lane.index)):
            self.pool.release(token)  # the rate limiter: wait for the instance's resources in rank order
            if lane.index not in self._waiting:
                self._waiting.add(lane.index)
                limits.when_free(lane.index, functools.partial(self._on_granted, lane))
            return
        self._granted.discard(lane.index)
        lane.busy = True
        direct = self.policy.strategy == "direct"
        # direct: a sequence's row is its slot, whatever runs beside it; oldest: rows in age order.
        positions = [(s.slot or 0) if direct else index for index, s in enumerate(chosen)]
        rows: list[Row | None] = [None] * (max(positions) + 1)
        for position, sequence in zip(positions, chosen):
            request = sequence.queue.popleft()
            self._queued -= 1
            sequence.running = True
            rows[position] = (sequence, request)
        requests = step_requests(self.policy, rows)
        stamp = time.monotonic_ns()
        queue_ns = [stamp - row[1].arrival_ns for row in rows if row is not None]
        self._in_flight += len(chosen)
        # A direct batch's size is its rows, empty ones included: the backend runs them all.
        if self._inline.admits(len(requests), self._loop.time()):
            try:
                outcome = self._inline.run(self.pool, lane.index, functools.partial(execute_batch, requests=requests),
                                           len(requests), self._loop.time)
            except Exception as exc:  # as a thread hands it over: every step in the batch gets it
                self._finish_step(lane, rows, queue_ns, None, exc)
            else:
                self._finish_step(lane, rows, queue_ns, outcome, None)
            return
        # From here to a model process, else the lane's thread; the step ends in the step of the loop that
        # has its result (the instance is released right after: a lane looks again a step later, ``_kick``).
        run_batch(self.pool, lane.index, requests, functools.partial(self._finish_step, lane, rows, queue_ns))

    def _on_granted(self, lane: Lane) -> None:
        self._waiting.discard(lane.index)
        self._granted.add(lane.index)
        self._kick(lane)

    def _give_back(self, lane: Lane, executed: bool) -> None:
        """The lane's rate-limiter resources go back after a batch, or unused."""
        limits = self.pool.limits
        if limits is None or not (executed or lane.index in self._granted):
            return
        self._granted.discard(lane.index)
        limits.give_back(lane.index, executed, pending=bool(lane.ready()))

    def _finish_step(self, lane: Lane, rows: list[Row | None], queue_ns: list[int], outcome: Any,
                     error: BaseException | None) -> None:
        lane.busy = False
        real = [(index, row) for index, row in enumerate(rows) if row is not None]
        self._in_flight -= len(real)
        if error is not None:
            if not isinstance(error, ApplianceError):
                log.error("model %s: sequence batch of %d failed: %r", self.label, len(real), error)
                error = InferenceFailed(f"model {self.label} failed: {type(error).__name__}: {error}")
            for _, (sequence, request) in real:
                sequence.running = False
                self._complete(request, None, error)
        else:
            results, timing = outcome
            self.stats.record_batch(len(real), len(real), queue_ns, timing)
            for position, (index, (sequence, request)) in enumerate(real):
                sequence.running = False
                if request.trace is not None:
                    mark_compute(request.trace, timing)
                if request.timing is not None:
                    request.timing.add(queue_ns[position], timing)
                self._settle(sequence, request, results[index])
        for _, (sequence, request) in real:
            self._after_step(sequence, request)
        self._give_back(lane, executed=True)
        if self._queued and lane.ready():  # what came during the step (else no loop turn for nothing)
            self._kick(lane)

    def _settle(self, sequence: Sequence, request: SequenceRequest, result: RequestResult) -> None:
        """Keep the sequence's new state from the outputs; answer the client with what it asked for (or run
        the request again: iterative_sequence)."""
        if isinstance(result, BaseException):
            self._complete(request, None, result)
            return
        if isinstance(result, Reschedule):
            if self.policy.iterative:
                self._reschedule(sequence, request)
            else:
                self._complete(request, None, reschedule_refused(self._model))
            return
        if isinstance(result, Future):  # the model answers after its step (a Python response sender)
            if self.policy.states:
                self._complete(request, None, InferenceFailed(
                    f"model '{self._model}' answered after its step returned, but its implicit state must come "
                    "with the step's outputs; return the response from execute()"))
                return
            self._complete_later(request, result)
            return
        for spec in self.policy.states:
            value = result.get(spec.output)
            if value is None:
                self._complete(request, None, InferenceFailed(
                    f"model '{self._model}' did not produce its state output '{spec.output}'; the state of sequence "
                    f"{sequence.corrid} was not updated"))
                return
            # A copy: the row is a view of the whole batch's output, which must not live as long as the sequence.
            sequence.state[spec.input] = np.array(value, copy=True)
        self._complete(request, _asked(result, request.outputs), None)

    def _reschedule(self, sequence: Sequence, request: SequenceRequest) -> None:
        """Queue the request on its sequence again (Triton: flags cleared, queued anew), unless its client
        went away."""
        if request.future.done() or request.cancelled():
            self._complete(request, None, Unavailable(
                f"the request to model '{self._model}' was cancelled; it is not run again"))
            return
        assert self._loop is not None
        request.flags = 0
        request.arrival = self._loop.time()
        request.again = True
        if request.trace is not None:
            request.trace.mark("QUEUE_START")
        sequence.queue.append(request)
        self._queued += 1

    def _complete_later(self, request: SequenceRequest, answer: Future) -> None:
        assert self._loop is not None

        def deliver(result: Any, error: BaseException | None) -> None:
            outputs = None if error else _asked(result, request.outputs)
            self._complete(request, outputs, error)

        answer_later(self._loop, answer, deliver)

    def _after_step(self, sequence: Sequence, request: SequenceRequest) -> None:
        if request.again:
            request.again = False  # queued to run again: the sequence goes on
        elif self.policy.iterative and not sequence.queue and self._sequences.get(sequence.corrid) is sequence:
            # Triton ends an iterative sequence once its request is released for good.
            self._end(sequence, "already ended (its request completed)", reaped=False)
        elif request.flags & END and not sequence.queue:
            self._end(sequence, "already ended (its last request carried END)", reaped=False)
        elif not sequence.queue and self._sequences.get(sequence.corrid) is sequence:
            assert self._loop is not None
            sequence.idle_since = now = self._loop.time()
            if self._reaper is None:
                self._reaper = self._loop.call_at(now + self.policy.idle_timeout, self._reap)

    def _reap(self) -> None:
        """End every sequence idle for ``max_sequence_idle_microseconds``; look again when the next may be.
        The live sequences are bounded (places and backlog), and each idle spell wakes this at most once."""
        assert self._loop is not None
        self._reaper = None
        now, timeout = self._loop.time(), self.policy.idle_timeout
        next_due: float | None = None
        for sequence in list(self._sequences.values()):
            since = sequence.idle_since
            if since is None or sequence.queue or sequence.running:
                continue
            if now - since < timeout - TIMER_SLACK:
                next_due = since + timeout if next_due is None else min(next_due, since + timeout)
                continue
            idle_us = round(timeout * 1e6)
            log.info("model %s: sequence %r idle for %d us, ended", self.label, sequence.corrid, idle_us)
            self._end(sequence, f"was ended after {idle_us} us without a request (max_sequence_idle_microseconds)",
                      reaped=True)
        if next_due is not None and not self._closing:
            self._reaper = self._loop.call_at(next_due, self._reap)

    def _end(self, sequence: Sequence, how: str, reaped: bool) -> None:
        sequence.idle_since = None
        if self._sequences.get(sequence.corrid) is sequence:
            del self._sequences[sequence.corrid]
        self._ended[sequence.corrid] = how
        while len(self._ended) > MAX_REMEMBERED_ENDS:
            self._ended.popitem(last=False)
        if reaped:
            self.counts.reaped += 1
        else:
            self.counts.ended += 1
        sequence.state = {}
        for promoted in self._table.remove(sequence):
            assert promoted.lane is not None
            self._kick(self._table.lanes[promoted.lane])
        self._count_places()

    def _count_places(self) -> None:
        self.counts.backlog = len(self._table.backlog)
        self.counts.active = len(self._sequences) - self.counts.backlog

    def _complete(self, request: SequenceRequest, result: Any, error: BaseException | None) -> None:
        self._answers.complete(request, result, error)


def _asked(result: Mapping[str, np.ndarray], names: tuple[str, ...]) -> Outputs:
    """The outputs a request asked for (a state output it did not ask for stays out), with the response
    parameters the model set."""
    return Outputs({name: result[name] for name in names if name in result}, getattr(result, "parameters", None))
