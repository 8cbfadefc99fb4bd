"""An ensemble request on the straight line (``ModelVersion.begin``): where its route is one frame of
steps (no decoupled step to fan out from, no ``max_inflight_requests`` to wait for), each step is begun on
its composing model's own line as soon as its inputs exist, and the steps after it from the callback of the
step that completes: no task and no coroutine a step, as for a request to the composing model itself.

A composing model the line does not serve (a response cache, say) runs its step as a task, as
``EnsembleRun`` runs every step. The first step that fails fails the request, and the steps still running
are withdrawn, as a client that goes away withdraws them all.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from appliance.backends.base import Outputs
from appliance.engine.scheduler.completion import run_as_task
from appliance.engine.types import InferResponse
from appliance.repository.ensemble.flow import Level
from appliance.repository.ensemble.plan import Step
from appliance.repository.ensemble.run import EnsembleRun, Frame, FrameTensor, SequenceTag, StepSlots, in_ensemble

if TYPE_CHECKING:
    from appliance.engine.model import ModelVersion

__all__ = ["EnsembleLine"]

Then = Callable[[Outputs | None, BaseException | None], None]


class EnsembleLine(EnsembleRun):
    """One request through a one-frame route, step by step from callbacks (``begin``)."""

    @staticmethod
    def serves(levels: Sequence[Level], slots: StepSlots) -> bool:
        """Whether a route runs on the line: one frame, nothing fanned out, no step slots to wait for."""
        return len(levels) == 1 and levels[0].fan_out is None and not slots.limited

    def begin(self, inputs: Mapping[str, np.ndarray], then: Then) -> None:
        """Begin the steps whose inputs the request carries; ``then(outputs, error)`` is called once, in the
        step of the loop that completes the last step (or fails one), unless ``withdraw`` came first. A step
        refused here fails the request here: the error is raised, and ``then`` is never called."""
        self._then = then
        self._tensors: Frame = {name: FrameTensor(inputs.get(name), self._sequence) for name in self._plan.inputs}
        self._waiting = list(self._levels[0].steps)
        self._running: dict[int, Callable[[], object]] = {}
        """Per step running, what withdraws it."""
        self._over = False
        self._beginning = True
        try:
            self._launch()
        finally:
            self._beginning = False

    def withdraw(self) -> None:
        """The client went away: the steps running are withdrawn and no other begins; ``then`` gets
        CancelledError now (unless it had the outcome already)."""
        self._fail(asyncio.CancelledError())

    def _launch(self) -> None:
        """Begin every waiting step whose inputs now exist; answer once none runs or waits."""
        tensors = self._tensors
        ready = []
        for step in self._waiting:  # (loops: all() over a generator costs a frame a step, every launch)
            for name in step.inputs.values():
                if name not in tensors:
                    break
            else:
                ready.append(step)
        for step in ready:
            self._waiting.remove(step)
            self._begin_step(step)
            if self._over:
                return
        if self._running:
            return
        if self._waiting:
            self._fail(self._starved(self._waiting, tensors))
        else:
            self._end(self._outputs_of(tensors), None)

    def _begin_step(self, step: Step) -> None:
        try:
            model = self._resolve(step.model, step.version)
            request, sequence = self._request(step, self._tensors)
        except Exception as exc:
            self._fail(in_ensemble(self._plan.name, exc))
            return
        done = functools.partial(self._step_done, step, sequence, model.hold())
        try:
            if model.straight:
                self._running[step.number] = model.begin(request, done)
            else:  # a step on a model the line does not serve: awaited, as a task
                self._running[step.number] = run_as_task(model.infer(request), done)
        except Exception as exc:  # refused before it was queued
            model.let_go()
            self._fail(in_ensemble(self._plan.name, exc))

    def _step_done(self, step: Step, sequence: SequenceTag, held: ModelVersion, response: InferResponse | None,
                   error: BaseException | None) -> None:
        held.let_go()
        self._running.pop(step.number, None)
        if self._over:  # withdrawn, or another step failed first
            return
        if error is not None:
            self._fail(error if isinstance(error, asyncio.CancelledError) else in_ensemble(self._plan.name, error))
            return
        assert response is not None
        self._tensors.update(self._made(step, response, sequence))
        self._launch()

    def _fail(self, error: BaseException) -> None:
        """The request fails with ``error`` and the steps still running are withdrawn; while ``begin`` runs,
        the error is raised from it (a refusal, as the awaited run raises it)."""
        if self._over:
            return
        running, self._running = self._running, {}
        self._over = True
        for withdraw in running.values():
            withdraw()
        if self._beginning:
            raise error
        self._answer_once(None, error)

    def _end(self, outputs: Outputs, error: None) -> None:
        self._over = True
        if self._beginning:  # (a route with no step to wait for) ``then`` never runs inside ``begin``
            asyncio.get_running_loop().call_soon(self._answer_once, outputs, error)
            return
        self._answer_once(outputs, error)

    def _answer_once(self, outputs: Outputs | None, error: BaseException | None) -> None:
        # ``then`` let go of once called: it refers to this request's holder, which refers to this line
        # (a reference cycle only the garbage collector would free, every request).
        then, self._then = self._then, _answered
        then(outputs, error)


def _answered(outputs: Outputs | None, error: BaseException | None) -> None:
    return None

