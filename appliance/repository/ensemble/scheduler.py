"""An ensemble's scheduler: where a backend model has its batching scheduler, an ensemble has this, which
runs each request through the steps (``appliance.repository.ensemble.run``) and counts it.

The composing model is looked up at each request (``resolve``), so a reloaded composing model serves
the next request and an unloaded one fails it with the registry's reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.core.errors import NotSupported, Unavailable
from appliance.engine.scheduler.completion import run_as_task
from appliance.engine.stats import BatchTiming, ModelStats, StepTiming
from appliance.engine.streaming import ResponseChannel
from appliance.repository.ensemble.flow import EnsembleFlow
from appliance.repository.ensemble.line import EnsembleLine
from appliance.repository.ensemble.run import EnsembleRun, Resolve, StepSlots

if TYPE_CHECKING:
    from appliance.backends.base import Outputs, ResponseSink
    from appliance.engine.trace import Trace

__all__ = ["EnsembleScheduler", "Resolve"]


class EnsembleScheduler:
    """Stands where a backend model has its batching scheduler (see ``ModelVersion.scheduler``)."""

    takes_straight = True
    """``ModelVersion.begin`` queues requests here with ``enqueue`` (see engine.model.StraightScheduler)."""

    def __init__(self, flow: EnsembleFlow, resolve: Resolve, stats: ModelStats, max_inflight_requests: int = 0) -> None:
        self.flow = flow
        self.plan = flow.plan
        self._resolve = resolve
        self.stats = stats
        self._slots = StepSlots(flow.plan.name, max_inflight_requests)
        self._in_flight = 0
        self._closing = False

    @property
    def pending(self) -> int:
        return 0  # an ensemble hands each request straight to its first steps' schedulers (as Triton)

    @property
    def execution(self) -> dict[str, Any]:
        return {"execution": "steps", "reason": "an ensemble's steps run where their models' plans say"}

    def start(self) -> None:
        self._closing = False

    async def drain(self, timeout: float) -> bool:
        self._closing = True
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not self._in_flight

    async def close(self, timeout: float | None = None) -> list[BaseException]:
        self._closing = True
        return []

    async def submit(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                     parameters: Mapping[str, Any], trace: Trace | None = None,
                     timing: StepTiming | None = None, request_id: str = "", sink: ResponseSink | None = None,
                     cancelled: Callable[[], bool] | None = None) -> Outputs:
        """Run the steps that lead to ``outputs``: their one answer, or (a decoupled ensemble, ``sink``
        given) every answer sent to ``sink``, the last with the final flag. The ensemble's statistics
        count the request as one execution whose queue and compute times are the sums over its steps
        (as Triton reports them)."""
        if sink is not None and not isinstance(sink, ResponseChannel):
            raise NotSupported(f"ensemble '{self.plan.name}' streams its responses to a response channel only")
        if self._closing:
            raise Unavailable(f"ensemble '{self.plan.name}' is unloading", retry_after=1)
        levels, needed = self.flow.route(frozenset(outputs))
        run = EnsembleRun(self.plan, levels, needed, outputs, self._resolve, self._slots, parameters, request_id,
                          sink)
        self._in_flight += 1
        try:
            result = await run.run(inputs)
        finally:
            self._in_flight -= 1
        self._count(run, batch_size, timing)
        return result

    def enqueue(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                parameters: Mapping[str, Any], then: Callable[[Any, BaseException | None], None],
                trace: Trace | None = None, request_id: str = "", timing: StepTiming | None = None) -> _Queued:
        """``submit`` without a task waiting (``ModelVersion.begin``): the steps begun now, on their models'
        lines where the route allows (``EnsembleLine``), else run as a task; ``then(outputs, error)`` is
        called in the step that completes the request. ``withdraw`` takes it back."""
        if self._closing:
            raise Unavailable(f"ensemble '{self.plan.name}' is unloading", retry_after=1)
        levels, needed = self.flow.route(frozenset(outputs))
        queued = _Queued(then)

        def finished(result: Any, error: BaseException | None) -> None:
            self._in_flight -= 1
            if error is None:
                self._count(run, batch_size, timing)
            queued.answer(result, error)

        run: EnsembleRun
        self._in_flight += 1
        if EnsembleLine.serves(levels, self._slots):
            line = run = EnsembleLine(self.plan, levels, needed, outputs, self._resolve, self._slots, parameters,
                                      request_id, None)
            queued.stop = line.withdraw
            try:
                line.begin(inputs, finished)
            except BaseException:  # refused before anything was queued: raised, as ``submit`` raises it
                self._in_flight -= 1
                raise
        else:  # a decoupled step to fan out from, or steps to wait for: the awaited run, as a task
            run = EnsembleRun(self.plan, levels, needed, outputs, self._resolve, self._slots, parameters,
                              request_id, None)
            queued.stop = run_as_task(run.run(inputs), finished)
        return queued

    @staticmethod
    def withdraw(queued: _Queued) -> bool:
        """Its client went away: the steps running are withdrawn; True unless it had its answer already."""
        return queued.withdraw()

    def _count(self, run: EnsembleRun, batch_size: int, timing: StepTiming | None) -> None:
        """A request that succeeded, as one execution whose times are its steps' sums (as Triton counts)."""
        spent = run.spent
        self.stats.record_batch(batch_size, 1, [spent.queue_ns], BatchTiming(spent.input_ns, spent.infer_ns,
                                                                             spent.output_ns))
        if timing is not None:  # a nested ensemble: its steps count in the outer one too
            timing.add(spent.queue_ns, spent)


class _Queued:
    """A request ``enqueue`` took: answered once through ``then``, or withdrawn first (then never)."""

    __slots__ = ("_then", "stop", "_over")

    def __init__(self, then: Callable[[Any, BaseException | None], None]) -> None:
        self._then = then
        self.stop: Callable[[], object] = _nothing
        self._over = False

    def answer(self, result: Any, error: BaseException | None) -> None:
        if not self._over:
            self._over = True
            then, self._then, self.stop = self._then, _ignore, _nothing  # (no cycle left through them)
            then(result, error)

    def withdraw(self) -> bool:
        if self._over:
            return False
        self._over = True
        stop, self._then, self.stop = self.stop, _ignore, _nothing
        stop()
        return True


def _nothing() -> None:
    return None


def _ignore(result: Any, error: BaseException | None) -> None:
    return None

