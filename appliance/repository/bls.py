"""The registry's models as backends call them (Triton's BLS), from any thread.

A Python model's call to another model arrives on a reader thread of the daemon; it is run here on the
event loop through the called model's own scheduler, exactly as a client's request (it batches with
them and counts in the statistics), and its outcome comes back to the caller's callback or, for a
stream, through a sink. The thread that asked never waits on the loop, and the loop never waits on it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from appliance.backends.base import ModelCall, Outputs, ResponseSink, StreamedCall
from appliance.core.errors import (
    ApplianceError,
    DeadlineExceeded,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NotSupported,
    Unavailable,
)
from appliance.core.tensors import v2_datatype
from appliance.engine.streaming import StreamLimits
from appliance.engine.types import InferInput, InferRequest, InferResponse, RequestedOutput
from appliance.repository.config import config_from_json
from appliance.repository.push_load import checked_push, load_push
from appliance.repository.pushed import FILE_PREFIX
from appliance.repository.served import Models

if TYPE_CHECKING:
    from appliance.engine.model import ModelVersion
    from appliance.repository.pushed import PushStore

__all__ = ["LocalModels"]


log = logging.getLogger(__name__)


def _outputs(response: InferResponse) -> Outputs:
    return Outputs({output.name: output.data for output in response.outputs}, response.parameters)


def _request(call: ModelCall, cancelled: Callable[[], bool] | None = None) -> InferRequest:
    parameters: dict[str, Any] = dict(call.parameters)
    if call.timeout_us:
        parameters["timeout"] = call.timeout_us
    if call.correlation_id:  # a sequence, as a client would name it
        parameters["sequence_id"] = call.correlation_id
        parameters["sequence_start"] = bool(call.flags & 1)
        parameters["sequence_end"] = bool(call.flags & 2)
    return InferRequest(
        inputs=[InferInput(name, v2_datatype(array.dtype), array) for name, array in call.inputs.items()],
        outputs=[RequestedOutput(name) for name in call.outputs],
        id=call.request_id or None,
        parameters=parameters,
        cancelled=cancelled,
    )


class LocalModels:
    """Implements ``appliance.backends.base.ModelCalls`` over a model registry."""

    def __init__(self, registry: Models, explicit: bool, pushes: PushStore | None = None,
                 limits: StreamLimits | None = None) -> None:
        """``explicit``: the model control mode lets models be loaded and unloaded on demand. ``pushes``:
        where a model's ``load_model(files=...)`` keeps the files, as the load API keeps a push's (None:
        files are refused). ``limits``: the calls' deadline (0: none) and how far a streamed one may run
        ahead of its caller."""
        self._registry = registry
        self._explicit = explicit
        self._pushes = pushes
        self._limits = limits or StreamLimits()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the registry's models run on (set before the first model that may call loads)."""
        self._loop = loop

    def _submit(self, coroutine: Any) -> Future:
        if self._loop is None or self._loop.is_closed():
            coroutine.close()
            return _failed(Unavailable("the server is not running"))
        if asyncio._get_running_loop() is self._loop:  # called on the loop (a channel it reads): no hop
            task = self._loop.create_task(coroutine)
            future: Future = Future()
            task.add_done_callback(functools.partial(_settle, future))
            future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)
            return future
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _model(self, call: ModelCall) -> ModelVersion:
        version = str(call.model_version) if call.model_version > 0 else None
        try:
            return self._registry.get(call.model_name, version)
        except (ModelNotFound, ModelNotReady):
            # Triton's words (python_backend request_executor.cc: the call failed before it was submitted),
            # which model code may look for.
            raise Unavailable(
                f"Model {call.model_name} - Error when running inference: Failed for execute the inference "
                f"request. Model '{call.model_name}' is not ready."
            ) from None

    # -- inference -------------------------------------------------------------------------------

    def begin(self, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
        loop = self._loop
        if loop is None or self._limits.deadline > 0:  # (under a deadline: awaited, as wait_for bounds it)
            self._submit(self._infer(call)).add_done_callback(functools.partial(_told, then))
        elif asyncio._get_running_loop() is loop:  # a model process's channel the loop reads
            self._on_loop(call, then)
        else:  # a model's own thread (in-process) or a channel's reader thread: one hop to the loop
            try:
                loop.call_soon_threadsafe(self._on_loop, call, then)
            except RuntimeError:  # the loop is closed
                _tell(then, None, Unavailable("the server is not running"))

    def _on_loop(self, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
        """``begin`` on the loop: the called model's straight line where it has one, as a client's request
        takes it; else awaited, as a task."""
        try:
            model = self._model(call)
        except ApplianceError as exc:
            _tell(then, None, exc)
            return
        if model.straight:
            _begin(model, call, then)
        else:
            self._submit(self._run(model, call)).add_done_callback(functools.partial(_told, then))

    async def _infer(self, call: ModelCall) -> Outputs:
        return await self._run(self._model(call), call)

    async def _run(self, model: ModelVersion, call: ModelCall) -> Outputs:
        with model.in_use():
            if model.decoupled:
                raise InvalidInput(
                    f"Model {call.model_name} is using the decoupled. The current BLS request call doesn't support "
                    "models using the decoupled transaction policy. Please use 'decoupled=True' argument to the "
                    "'exec' or 'async_exec' calls for decoupled models.'"
                )
            return _outputs(await self._bounded(model.infer(_request(call)), call))

    async def _bounded(self, running: Awaitable[InferResponse], call: ModelCall,
                       cancelled: Callable[[], bool] | None = None) -> InferResponse:
        """The call, cancelled past the deadline (a call of a model to itself, waiting in the queue of the
        only instance, which its caller holds, would otherwise wait for ever)."""
        deadline = self._limits.deadline
        if deadline <= 0:
            return await running
        try:
            return await asyncio.wait_for(running, deadline)
        except TimeoutError:
            raise DeadlineExceeded(
                f"the call to model '{call.model_name}' did not complete within request_deadline ({deadline:g} s); "
                "it was cancelled") from None

    def stream(self, call: ModelCall, sink: ResponseSink) -> StreamedCall:
        streamed = _StreamedCall(self._loop)
        streamed.future = self._submit(self._stream(call, sink, streamed))
        return streamed

    async def _stream(self, call: ModelCall, sink: ResponseSink, streamed: _StreamedCall) -> None:
        try:
            model = self._model(call)
            with model.in_use():
                if not model.decoupled:  # a stream of one
                    outputs = _outputs(await self._bounded(model.infer(_request(call, streamed.cancelled)), call))
                    sink.send(outputs, parameters=outputs.parameters, final=True)
                    return
                stream = await model.open_stream(_request(call, streamed.cancelled), self._limits)
                try:
                    async for item in stream:
                        sent = _outputs(item.response) if item.response is not None else None
                        sink.send(sent, error=item.error, parameters=sent.parameters if sent else None,
                                  final=item.final)
                        if item.final:
                            return
                finally:
                    stream.close()
                sink.send(None, error=Unavailable(f"model '{call.model_name}' ended the stream early"), final=True)
        except asyncio.CancelledError:
            sink.send(None, error=_Cancelled("the request was cancelled"), final=True)
            raise
        except ApplianceError as exc:
            sink.send(None, error=exc, final=True)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never lost on the loop
            log.exception("a streamed call to model %s failed", call.model_name)
            sink.send(None, error=exc, final=True)

    # -- readiness and lifecycle -----------------------------------------------------------------

    def ready(self, name: str, version: str = "") -> bool:
        try:
            self._registry.get(name, version or None)
        except ApplianceError:
            return False
        return True

    def _check_control(self, action: str) -> None:
        if not self._explicit:
            raise InvalidInput(
                f"explicit model {action} is not allowed unless the model control mode is explicit; start the "
                "daemon with --model-control-mode explicit"
            )

    def push_limits(self) -> tuple[int, int] | None:
        limits = self._pushes.limits if self._pushes is not None else None
        return (limits.max_file_bytes, limits.max_total_bytes) if limits is not None else None

    def load(self, name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> Future[None]:
        return self._submit(self._load(name, config, files or {}))

    async def _load(self, name: str, config: str, files: Mapping[str, bytes]) -> None:
        self._check_control("load")
        self._registry.model_dir(name)
        if files:  # the load API's file overrides: the same checks, the same store, the same bounds
            if self._pushes is None:
                raise NotSupported("this box keeps no pushed models (its state dir is not writable); put the "
                                   "files in the repository, or make the state dir writable and restart the daemon")
            bad = [key for key in files if not key.startswith(FILE_PREFIX)]
            if bad:
                raise InvalidInput(f"load_model files are named '{FILE_PREFIX}<path>' (e.g. 'file:1/model.onnx'), "
                                   f"got {bad[0][:120]!r}")
            override, checked = checked_push(self._pushes, name, {"config": config, **files} if config else files)
            await load_push(self._registry, self._pushes, name, override, checked)
            return
        override = config_from_json(config, name) if config else None
        await self._registry.load(name, override)

    def unload(self, name: str, unload_dependents: bool = False) -> Future[None]:
        return self._submit(self._unload(name, unload_dependents))

    async def _unload(self, name: str, unload_dependents: bool) -> None:
        self._check_control("unload")
        self._registry.model_dir(name)
        await self._registry.unload(name, unload_dependents=unload_dependents)


def _begin(model: ModelVersion, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
    """``call`` on ``model``'s straight line (``ModelVersion.begin``, on the loop): the model held until
    ``then`` has the outcome. Nothing withdraws it (a caller does not take a call back; a stopping daemon
    fails what is queued)."""
    model.hold()

    def landed(response: InferResponse | None, error: BaseException | None) -> None:
        model.let_go()
        if error is not None:
            _tell(then, None, error)
        else:
            assert response is not None
            _tell(then, _outputs(response), None)

    try:
        model.begin(_request(call), landed)
    except Exception as exc:  # refused before it queued (an invalid call): the caller's error, as awaited
        model.let_go()
        _tell(then, None, exc)


def _tell(then: Callable[[Outputs | None, BaseException | None], None], outputs: Outputs | None,
          error: BaseException | None) -> None:
    """A call's outcome to its caller's ``then``, which must not raise into the called model's scheduler
    (a future's callback is as safe): anything it raises is logged."""
    try:
        then(outputs, error)
    except Exception:
        log.exception("a BLS caller's callback failed")


def _told(then: Callable[[Outputs | None, BaseException | None], None], future: Future) -> None:
    """``_tell`` of a call that ran as a task (its future)."""
    if future.cancelled():
        _tell(then, None, Unavailable("the call was cancelled (the server is stopping); retry"))
        return
    error = future.exception()
    _tell(then, None if error is not None else future.result(), error)


def _failed(error: BaseException) -> Future[Any]:
    """A call's future, failed at once (``error``)."""
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


def _settle(future: Future, task: asyncio.Task) -> None:
    if future.cancelled():
        return
    if task.cancelled():
        future.cancel()
        return
    error = task.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(task.result())


class _StreamedCall:
    """A streamed call in flight (``appliance.backends.base.StreamedCall``); its methods may be called
    from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._asked = False
        self.future: Future | None = None

    def cancelled(self) -> bool:
        """The called model's cancellation probe."""
        return self._asked

    def cancel(self) -> None:
        self._asked = True  # read by the model's is_cancelled(); what it still sends is delivered

    def abandon(self) -> None:
        self._asked = True
        loop, future = self._loop, self.future
        if loop is not None and future is not None and not loop.is_closed():
            loop.call_soon_threadsafe(future.cancel)


class _Cancelled(ApplianceError):
    """Triton's CANCELLED: a 400 over HTTP, its own code over gRPC."""

    status = HTTPStatus.BAD_REQUEST
    grpc_code = "CANCELLED"
