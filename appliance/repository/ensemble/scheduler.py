"""Run an ensemble's steps for one request: each step as soon as its input tensors exist, independent
branches concurrently, each step through its composing model's own ``ModelVersion.infer`` (so it is
validated, queued and batched with that model's direct traffic, and counted in its statistics).

Tensors pass between steps as the numpy arrays the composing models returned; nothing is serialised.
The composing model is looked up at each request (``resolve``), so a reloaded composing model serves
the next request and an unloaded one fails it with the registry's reason.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.engine.stats import BatchTiming, ModelStats, StepTiming
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.errors import ApplianceError, InferenceFailed, InvalidInput, NotSupported, Unavailable
from appliance.repository.ensemble.plan import EnsemblePlan, Step
from appliance.tensors import v2_datatype

if TYPE_CHECKING:
    from appliance.backends.base import ResponseSink
    from appliance.engine.model import ModelVersion
    from appliance.engine.trace import Trace

__all__ = ["EnsembleScheduler", "Resolve"]

Resolve = Callable[[str, int | None], "ModelVersion"]
"""(model, version or None for the newest) -> the ready version, or ModelNotReady/ModelNotFound."""


def _in_ensemble(name: str, exc: BaseException) -> ApplianceError:
    """The step's error, as Triton reports it from inside an ensemble, keeping its kind (and status)."""
    if isinstance(exc, ApplianceError):
        message = f"in ensemble '{name}', {exc.message}"
        try:
            wrapped = copy.copy(exc)
        except TypeError:  # an error whose constructor takes more than the message
            return InferenceFailed(message)
        wrapped.message, wrapped.args = message, (message,)
        return wrapped
    return InferenceFailed(f"in ensemble '{name}', {type(exc).__name__}: {exc}")


class EnsembleScheduler:
    """Stands where a backend model has its batching scheduler (see ``ModelVersion.scheduler``)."""

    def __init__(self, plan: EnsemblePlan, resolve: Resolve, stats: ModelStats) -> None:
        self.plan = plan
        self._resolve = resolve
        self.stats = stats
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
                     cancelled: Callable[[], bool] | None = None) -> dict[str, np.ndarray]:
        """Run the steps that lead to ``outputs``; the ensemble's statistics count the request as one
        execution whose queue and compute times are the sums over its steps (as Triton reports them).
        ``sink`` (a decoupled request) never comes: decoupled ensembles are refused at load."""
        if sink is not None:
            raise NotSupported(f"ensemble '{self.plan.name}' cannot stream responses (decoupled ensembles are not "
                               "supported)")
        if self._closing:
            raise Unavailable(f"ensemble '{self.plan.name}' is unloading", retry_after=1)
        steps, needed = self.plan.needed(frozenset(outputs))
        spent = StepTiming()
        self._in_flight += 1
        try:
            tensors = await self._execute(steps, dict(inputs), needed, parameters, spent)
        finally:
            self._in_flight -= 1
        self.stats.record_batch(batch_size, 1, [spent.queue_ns],
                                BatchTiming(spent.input_ns, spent.infer_ns, spent.output_ns))
        if timing is not None:  # a nested ensemble: its steps count in the outer one too
            timing.add(spent.queue_ns, spent)
        return {name: tensors[name] for name in outputs}

    async def _execute(self, steps: Sequence[Step], tensors: dict[str, np.ndarray], needed: frozenset[str],
                       parameters: Mapping[str, Any], spent: StepTiming) -> dict[str, np.ndarray]:
        waiting = list(steps)
        running: dict[asyncio.Task, Step] = {}
        try:
            while waiting or running:
                ready = [step for step in waiting if all(t in tensors for t in step.inputs.values())]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:  # a chain: run the step inline, no task to schedule
                    tensors.update(await self._run_step(ready[0], tensors, needed, parameters, spent))
                    continue
                for step in ready:
                    task = asyncio.create_task(self._run_step(step, tensors, needed, parameters, spent))
                    running[task] = step
                if not running:
                    raise self._starved(waiting, tensors)
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    tensors.update(task.result())  # the first failed step fails the request
        finally:
            for task in running:  # a failed step, or a client gone: the other branches stop
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return tensors

    def _starved(self, waiting: list[Step], tensors: Mapping[str, np.ndarray]) -> InvalidInput:
        step = waiting[0]
        missing = sorted(t for t in step.inputs.values() if t not in tensors)
        return InvalidInput(f"in ensemble '{self.plan.name}', {step.label} cannot run: ensemble input(s) "
                            f"{missing} were not given; send them with the request")

    async def _run_step(self, step: Step, tensors: Mapping[str, np.ndarray], needed: frozenset[str],
                        parameters: Mapping[str, Any], spent: StepTiming) -> dict[str, np.ndarray]:
        try:
            model = self._resolve(step.model, step.version)
            request = InferRequest(
                inputs=[InferInput(key, v2_datatype(tensors[t].dtype), tensors[t]) for key, t in step.inputs.items()],
                outputs=[RequestedOutput(key) for key, t in step.outputs.items() if t in needed],
                parameters=dict(parameters),
                timing=spent,
            )
            with model.in_use():
                response = await model.infer(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _in_ensemble(self.plan.name, exc) from None
        return {step.outputs[output.name]: output.data for output in response.outputs}
