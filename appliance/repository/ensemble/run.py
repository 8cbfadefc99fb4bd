"""One request through an ensemble: its frames (see ``appliance.repository.ensemble.flow``) run as their
tensors appear, and every frame of the last level answers the client once.

Inside a frame each step runs as soon as its input tensors exist, independent branches concurrently,
each step through its composing model's own ``ModelVersion`` (so it is validated, queued and batched
with that model's direct traffic, and counted in its statistics). A decoupled step is opened as a
stream; each of its responses opens a frame of the next level as soon as it arrives, so the steps after
it work on one response while the model produces the next.

Order and memory: the frames a stream opens answer in the order of its responses (a later one that is
ready first waits for its turn), and at most ``StreamLimits.max_responses`` of them are open at once
per stream: while that many are, the stream is not read, its channel fills and the decoupled model's
``send`` blocks (``appliance.engine.streaming``), so a fast producer is slowed to the pace of the
steps after it and of the client, instead of piling up responses. ``max_inflight_requests`` in
``ensemble_scheduling`` also bounds each step's requests in flight across all of the ensemble's
requests (Triton's shared per-step limit).

Errors and cancellation: the first step that fails (or a decoupled step's error response) fails the
request with that step's error, prefixed as Triton does; every other step still running is cancelled
(a stream is closed, so its model sees ``request.is_cancelled()``), as when the client goes away.

Tensors pass between steps as the numpy arrays the composing models returned; nothing is serialised. A
step that does not produce one of its mapped outputs passes nothing on for it (Triton): a step reading
it gets no such input, and the ensemble's response leaves it out. Each tensor keeps the sequence it
belongs to (the request's ``sequence_id``/``sequence_start``/``sequence_end``, or what the step's
response set in those parameters), passed to the steps that read it and reported in the ensemble's
response parameters, as Triton does.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from appliance.backends.base import Outputs
from appliance.core.errors import ApplianceError, InferenceFailed, InvalidInput, NotSupported
from appliance.core.tensors import v2_datatype
from appliance.engine.stats import StepTiming
from appliance.engine.streaming import ResponseChannel, ResponseStream, StreamLimits
from appliance.engine.types import InferInput, InferRequest, InferResponse, RequestedOutput
from appliance.repository.ensemble.flow import Level
from appliance.repository.ensemble.plan import EnsemblePlan, Step

if TYPE_CHECKING:
    from appliance.engine.model import ModelVersion

__all__ = ["EnsembleRun", "Resolve", "StepSlots", "in_ensemble"]

log = logging.getLogger(__name__)

Resolve = Callable[[str, int | None], "ModelVersion"]
"""(model, version or None for the newest) -> the ready version, or ModelNotReady/ModelNotFound."""

_SEQUENCE_KEYS = frozenset(("sequence_id", "sequence_start", "sequence_end"))
_DEFAULT_LIMITS = StreamLimits()


def in_ensemble(name: str, exc: BaseException) -> ApplianceError:
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


class SequenceTag(NamedTuple):
    """The sequence a tensor belongs to (Triton keeps a correlation ID and START/END flags with it). A
    tuple, as ``FrameTensor``: a few are made for every request, where a frozen dataclass sets each field
    through ``object.__setattr__``."""

    corrid: int | str
    start: bool
    end: bool

    @classmethod
    def of(cls, parameters: Mapping[str, Any], default: SequenceTag | None = None) -> SequenceTag:
        corrid = parameters.get("sequence_id", default.corrid if default is not None else 0)
        if type(corrid) is not int and not isinstance(corrid, str):
            corrid = default.corrid if default is not None else 0
        return cls(corrid, parameters.get("sequence_start") is True, parameters.get("sequence_end") is True)

    def parameters(self) -> dict[str, Any]:
        return {"sequence_id": self.corrid, "sequence_start": self.start, "sequence_end": self.end}


class FrameTensor(NamedTuple):
    data: np.ndarray | None
    """None: not given (an optional ensemble input) or not produced by the step that maps it."""
    sequence: SequenceTag


Frame = dict[str, FrameTensor]
Emit = Callable[[Frame], Awaitable[None]]


class _Stopped(Exception):
    """The client's stream was cancelled or failed (stalled): nothing more can reach it."""


class StepSlots:
    """Triton's ``max_inflight_requests``: at most that many requests in flight per step, shared by all
    of the ensemble's requests (a decoupled step's holds its slot until its last response). A request
    that waits longer than ``patience`` seconds goes ahead anyway, with a warning, as Triton does, so
    that steps waiting on each other cannot deadlock."""

    def __init__(self, ensemble: str, limit: int, patience: float = 300.0) -> None:
        self._ensemble = ensemble
        self._limit = limit
        self._patience = patience
        self._slots: dict[int, asyncio.Semaphore] = {}

    @property
    def limited(self) -> bool:
        return self._limit > 0

    async def acquire(self, step: Step) -> bool:
        """True when a slot was taken (and must be given back with ``release``)."""
        if self._limit <= 0:
            return False
        slots = self._slots.setdefault(step.number, asyncio.Semaphore(self._limit))
        try:
            await asyncio.wait_for(slots.acquire(), self._patience)
        except TimeoutError:
            log.error("ensemble '%s' could not schedule %s within %g s (its %d requests in flight, "
                      "max_inflight_requests, did not end); running it anyway to avoid a deadlock", self._ensemble,
                      step.label, self._patience, self._limit)
            return False
        return True

    def release(self, step: Step) -> None:
        self._slots[step.number].release()


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """What failed first in a task group (a step's error rather than the cancellations it caused)."""
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            error = _first_error(error)
        if not isinstance(error, asyncio.CancelledError):
            return error
    return group.exceptions[0]


class EnsembleRun:
    """One request's pass through the levels of its route."""

    def __init__(self, plan: EnsemblePlan, levels: tuple[Level, ...], needed: frozenset[str],
                 outputs: Sequence[str], resolve: Resolve, slots: StepSlots, parameters: Mapping[str, Any],
                 request_id: str, sink: ResponseChannel | None) -> None:
        self._plan = plan
        self._levels = levels
        self._needed = needed
        self._outputs = outputs
        self._resolve = resolve
        self._slots = slots
        self._parameters = parameters
        self._sequence = SequenceTag.of(parameters)
        self._request_id = request_id
        self._sink = sink
        self._limits = sink.limits if sink is not None else _DEFAULT_LIMITS
        self.spent = StepTiming()
        self._live = 0
        """Frames that may still answer: the emitting one alone means its answer is the last."""
        self._final_sent = False
        self._result: Outputs | None = None

    async def run(self, inputs: Mapping[str, np.ndarray]) -> Outputs:
        """The ensemble's single answer (not decoupled), or, with a sink, every answer sent to it and the
        final flag after the last (an empty result is returned)."""
        frame = {name: FrameTensor(inputs.get(name), self._sequence) for name in self._plan.inputs}
        self._live = 1
        try:
            await self._frame(0, frame, self._answer)
        except _Stopped:
            return Outputs({})
        if self._sink is None:
            if self._result is None:  # cannot happen: the request's own frame always answers
                raise InferenceFailed(f"in ensemble '{self._plan.name}', no step produced the ensemble's outputs")
            return self._result
        if not self._final_sent:  # the last answer went before the last stream ended: the flag alone
            await self._sink.put(final=True)
        return Outputs({})

    # -- frames -----------------------------------------------------------------------------------

    async def _frame(self, index: int, frame: Frame, emit: Emit) -> None:
        level = self._levels[index]
        if level.steps:
            frame = await self._execute(level.steps, frame)
        if level.fan_out is None:
            await emit(frame)
            self._live -= 1
            return
        await self._fan_out(level.fan_out, frame, index + 1, emit)

    async def _execute(self, steps: Sequence[Step], frame: Frame) -> Frame:
        """Run ``steps`` (in dependency order), each as soon as its inputs are in ``frame``."""
        frame = dict(frame)
        waiting = list(steps)
        running: dict[asyncio.Task, Step] = {}
        try:
            while waiting or running:
                ready = [step for step in waiting if all(t in frame for t in step.inputs.values())]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:  # a chain: run the step inline, no task to schedule
                    frame.update(await self._run_step(ready[0], frame))
                    continue
                for step in ready:
                    running[asyncio.create_task(self._run_step(step, frame))] = step
                if not running:
                    raise self._starved(waiting, frame)
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    frame.update(task.result())  # the first failed step fails the request
        finally:
            for task in running:  # a failed step, or a client gone: the other branches stop
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return frame

    def _starved(self, waiting: list[Step], frame: Frame) -> InvalidInput:
        step = waiting[0]
        missing = sorted(t for t in step.inputs.values() if t not in frame)
        return InvalidInput(f"in ensemble '{self._plan.name}', {step.label} cannot run: tensor(s) {missing} were "
                            "not produced; send the ensemble inputs they come from with the request")

    # -- steps ------------------------------------------------------------------------------------

    def _request(self, step: Step, frame: Frame) -> tuple[InferRequest, SequenceTag]:
        sequence = self._sequence
        inputs = []
        for key, name in step.inputs.items():
            tensor = frame[name]
            if tensor.sequence is not self._sequence and sequence is self._sequence:
                sequence = tensor.sequence  # the first a step's response set, as Triton takes it
            if tensor.data is not None:
                inputs.append(InferInput(key, v2_datatype(tensor.data.dtype), tensor.data))
        parameters = dict(self._parameters)
        if sequence is not self._sequence:  # the steps after a response that set it follow it
            parameters.update(sequence.parameters())
        request = InferRequest(
            inputs=inputs,
            outputs=[RequestedOutput(key) for key, tensor in step.outputs.items() if tensor in self._needed],
            id=self._request_id or None,
            parameters=parameters,
            timing=self.spent,
        )
        return request, sequence

    def _made(self, step: Step, response: InferResponse, sequence: SequenceTag) -> Frame:
        """The tensors one response of ``step`` makes (None for a mapped output it did not produce)."""
        if response.parameters and not _SEQUENCE_KEYS.isdisjoint(response.parameters):
            sequence = SequenceTag.of(response.parameters, sequence)
        produced = {output.name: output.data for output in response.outputs}
        return {tensor: FrameTensor(produced.get(key), sequence) for key, tensor in step.outputs.items()
                if tensor in self._needed}

    async def _run_step(self, step: Step, frame: Frame) -> Frame:
        taken = self._slots.limited and await self._slots.acquire(step)
        try:
            model = self._resolve(step.model, step.version)
            request, sequence = self._request(step, frame)
            with model.in_use():
                response = await model.infer(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise in_ensemble(self._plan.name, exc) from None
        finally:
            if taken:
                self._slots.release(step)
        return self._made(step, response, sequence)

    async def _fan_out(self, step: Step, frame: Frame, index: int, emit: Emit) -> None:
        """Open ``step``'s stream; each response runs level ``index`` in a frame of its own."""
        if self._sink is None:
            raise NotSupported(f"ensemble '{self._plan.name}' has a decoupled step ({step.label}); call it through "
                               "a streaming API: HTTP generate_stream or gRPC ModelStreamInfer")
        taken = self._slots.limited and await self._slots.acquire(step)

        def ended() -> None:  # the step's last response came (or it failed): its slot is free (Triton)
            nonlocal taken
            if taken:
                taken = False
                self._slots.release(step)

        try:
            try:
                model = self._resolve(step.model, step.version)
                request, sequence = self._request(step, frame)
            except Exception as exc:
                raise in_ensemble(self._plan.name, exc) from None
            with model.in_use():
                await self._read_stream(model, request, sequence, step, index, emit, ended)
        finally:
            ended()

    async def _read_stream(self, model: ModelVersion, request: InferRequest, sequence: SequenceTag, step: Step,
                           index: int, emit: Emit, ended: Callable[[], None]) -> None:
        stream: ResponseStream | None = None
        try:
            if model.decoupled:
                assert self._sink is not None
                stream = await model.open_stream(request, self._limits, self._sink.account)
                responses = self._stream_responses(stream)
            else:  # reloaded as a model that answers once since the ensemble loaded: a stream of one
                responses = _one(await model.infer(request))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise in_ensemble(self._plan.name, exc) from None
        window = asyncio.Semaphore(self._limits.max_responses)
        previous: asyncio.Future | None = None
        try:
            async with asyncio.TaskGroup() as group:
                async for response in responses:
                    await window.acquire()  # while the frames it opened are this many, the stream waits
                    done = asyncio.get_running_loop().create_future()
                    self._live += 1
                    group.create_task(self._child(index, self._made(step, response, sequence), emit, previous,
                                                  done, window))
                    previous = done
                self._live -= 1  # the stream ended: its frames are all open
                ended()
        except BaseExceptionGroup as failed:
            raise _first_error(failed) from None
        finally:
            if stream is not None:
                stream.close()  # before its final response: the model sees the request cancelled

    async def _stream_responses(self, stream: ResponseStream) -> AsyncIterator[InferResponse]:
        """A decoupled step's responses; its first error response fails the request (Triton)."""
        async for item in stream:
            if item.error is not None:
                raise in_ensemble(self._plan.name, item.error)
            if item.response is not None:
                yield item.response

    async def _child(self, index: int, frame: Frame, emit: Emit, previous: asyncio.Future | None,
                     done: asyncio.Future, window: asyncio.Semaphore) -> None:
        async def in_turn(answer: Frame) -> None:
            if previous is not None:
                await previous  # the earlier responses' frames answer first
            await emit(answer)

        try:
            await self._frame(index, frame, in_turn)
        finally:
            window.release()
            if not done.done():
                done.set_result(None)

    # -- answers ----------------------------------------------------------------------------------

    def _outputs_of(self, frame: Frame) -> Outputs:
        """The ensemble's answer from a frame of the last level: the outputs asked for (one no step produced
        is left out, as Triton leaves it) and the sequence they belong to."""
        outputs: dict[str, np.ndarray] = {}
        parameters: dict[str, Any] = {}
        for name in self._outputs:
            tensor = frame[name]
            if tensor.data is not None:
                outputs[name] = tensor.data
                parameters = tensor.sequence.parameters()
        return Outputs(outputs, parameters)

    async def _answer(self, frame: Frame) -> None:
        answer = self._outputs_of(frame)
        if self._sink is None:
            self._result = answer
            return
        final = self._live == 1  # nothing else may answer after this
        if not await self._sink.put(answer, parameters=answer.parameters, final=final):
            raise _Stopped
        self._final_sent = final


async def _one(response: InferResponse) -> AsyncIterator[InferResponse]:
    yield response
