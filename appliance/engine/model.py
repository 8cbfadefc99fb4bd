"""A loaded, servable model version: validation, scheduling and output post-processing."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BackendInfo
from appliance.backends.base import Outputs, model_parameters
from appliance.core.errors import (
    ApplianceError,
    DeadlineExceeded,
    InvalidInput,
    RefusedByRuntime,
    Unavailable,
)
from appliance.core.tensors import v2_datatype
from appliance.engine.classification import classify
from appliance.engine.response_cache import OutputForms, ResponseStore
from appliance.engine.signature import ModelSignature, input_reshapes
from appliance.engine.stats import FailureReason, ModelStats, StepTiming
from appliance.engine.streaming import RawResponse, ResponseChannel, ResponseStream, StreamLimits
from appliance.engine.traffic import ItemShapes, TrafficStats
from appliance.engine.types import InferOutput, InferRequest, InferResponse, RequestedOutput
from appliance.engine.validation import validate_request

if TYPE_CHECKING:
    from appliance.backends.base import ResponseSink
    from appliance.engine.trace import Trace

__all__ = ["ModelVersion", "VersionScheduler"]

ACCEPTED_FORMS = 64
"""Forms of request (see ``ModelVersion._accept``) a version remembers as valid, the first ones it sees:
another form is validated every time, as a request of any form was before."""


class VersionScheduler(Protocol):
    """What runs a version's validated requests: a backend model's batching scheduler
    (``appliance.engine.scheduler.Scheduler``), a stateful model's sequence batcher
    (``appliance.engine.scheduler.SequenceScheduler``) or an ensemble's (``appliance.repository.ensemble``)."""

    @property
    def pending(self) -> int: ...

    @property
    def execution(self) -> dict[str, Any]:
        """Where its batches run (``/selection`` shows it): inline on the event loop or on threads."""

    def start(self) -> None: ...

    async def submit(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                     parameters: Mapping[str, Any], trace: Trace | None = None,
                     timing: StepTiming | None = None, request_id: str = "", sink: ResponseSink | None = None,
                     cancelled: Callable[[], bool] | None = None) -> dict[str, np.ndarray]: ...

    async def drain(self, timeout: float) -> bool: ...

    async def close(self, timeout: float | None = None) -> list[BaseException]: ...


class StraightScheduler(Protocol):
    """A scheduler ``ModelVersion.begin`` serves through (``straight``): the batching scheduler, the
    sequence batcher and an ensemble's; each says so with ``takes_straight``. ``enqueue`` queues a request
    whose outcome goes to ``then`` (``timing``: where an ensemble adds its step's times); ``withdraw``
    takes what it returned back (``then`` is then never called)."""

    takes_straight: bool

    def enqueue(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int,
                parameters: Mapping[str, Any], then: Callable[[Any, BaseException | None], None],
                trace: Trace | None = None, request_id: str = "", timing: StepTiming | None = None) -> Any: ...

    def withdraw(self, queued: Any) -> bool: ...


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.CancelledError, DeadlineExceeded)):
        return FailureReason.CANCELED
    if isinstance(exc, Unavailable):
        return FailureReason.REJECTED
    if isinstance(exc, RefusedByRuntime) or (isinstance(exc, ApplianceError) and not isinstance(exc, InvalidInput)):
        return FailureReason.BACKEND
    return FailureReason.OTHER


@dataclasses.dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: mc.ModelConfig
    signature: ModelSignature
    backend: BackendInfo | None
    """The runtime serving it; None for an ensemble, which has none of its own."""
    scheduler: VersionScheduler
    stats: ModelStats
    labels: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    selection: dict[str, Any] | None = None
    """The measured plan decision (see appliance.selection), with ``cache`` hit/miss."""
    response_cache: ResponseStore | None = None
    """The server's response cache, when the server has one (``cache_config``) and this version's config
    enables it (``response_cache { enable: true }``); None answers every request from the model."""
    content_digest: bytes | None = None
    """A digest of the version's name, config and files, where the cache is shared with other servers
    (Redis): their entries for the same model are this version's. None: a namespace of this load's own."""

    def __post_init__(self) -> None:
        if self.response_cache is not None and not self.config.response_cache.enable:
            self.response_cache = None
        # This version's entries (dropped when it closes, where the cache is this process's own).
        self._cache_owner = (self.response_cache.version_owner(self.content_digest)
                             if self.response_cache is not None else b"")
        self._streams: set[ResponseChannel] = set()  # open streams of a decoupled model, failed at close
        self._users = 0  # requests holding this version (see in_use), so a retired version drains
        self._running = 0  # requests between validation and their result: the concurrency traffic records
        self._decoupled = bool(self.config.model_transaction_policy.decoupled)  # read twice per request
        self.straight: bool = (getattr(self.scheduler, "takes_straight", False) and self.response_cache is None
                               and not self._decoupled)
        """Whether ``begin`` serves this version: its scheduler takes the straight line (the batching
        scheduler, the sequence batcher, an ensemble's), no response cache, not decoupled (an attribute:
        every request asks)."""
        self.traffic = TrafficStats(self.signature.batched)
        """The shapes, batch sizes and concurrency of the requests this version served, when selection
        chose its plan (see appliance.repository.retune)."""
        self._accepted: dict[tuple, tuple[int, ItemShapes]] = {}
        """Forms of request found valid, with their batch size and what ``traffic`` counts (``_accept``)."""
        batch = (-1,) if self.signature.batched else ()
        # config `reshape`: clients send `dims`, the runtime sees `reshape.shape` (and back for outputs).
        self._input_reshape = input_reshapes(self.config)
        self._output_reshape = {
            o.name: (*batch, *o.dims) for o in self.config.output if o.HasField("reshape")
        }
        # What a response from the cache must look like: the outputs as the runtime makes them (reshaped).
        runtime_dims = {o.name: tuple(o.reshape.shape) for o in self.config.output if o.HasField("reshape")}
        self._output_forms = OutputForms(self.name, {
            name: (spec.datatype, runtime_dims.get(name, spec.dims)) for name, spec in self.signature.outputs.items()
        }, self.signature.batched)
        # No outputs named in a request: every output the model has, none classified (built once).
        self._every_output = [RequestedOutput(name) for name in self.signature.outputs]
        self._every_output_name = [name for name in self.signature.outputs]
        # ...in the order the model made them, as Triton answers (a Python model's tensor order; a tensor
        # runtime's is the config's). An ensemble's are in its config's order (see differences-from-triton).
        self._produced_order = {o.name: o for o in self._every_output} if self.backend is not None else None

    @property
    def platform(self) -> str:
        return self.config.platform or (self.backend.platform if self.backend is not None else "")

    @property
    def backend_name(self) -> str:
        return self.backend.name if self.backend is not None else self.platform

    @property
    def decoupled(self) -> bool:
        """Zero, one or many responses per request (config ``model_transaction_policy { decoupled: true }``):
        served by ``open_stream`` only."""
        return self._decoupled

    def start(self) -> None:
        self.scheduler.start()

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and post-process one request; counts it in ``stats`` and ``traffic`` once
        it is valid."""
        batch_size = self._accept(request)
        start = time.perf_counter_ns()
        try:
            response = await self._run(request, batch_size)
        except BaseException as exc:
            self._settle(start, exc)
            raise
        self._settle(start, None)
        return response

    def begin(self, request: InferRequest, then: Callable[[InferResponse | None, BaseException | None], None],
              ) -> Callable[[], bool]:
        """``infer`` without a task waiting, where ``straight``: queue the request (refusals raise here) and
        call ``then(response, error)`` in the step that completes it; the result withdraws the request
        (its client went away: ``then`` gets CancelledError, and True, unless it had its answer already)."""
        batch_size = self._accept(request)
        start = time.perf_counter_ns()

        def finished(results: Any, error: BaseException | None) -> None:
            if error is None:
                try:
                    response = self._response(request, results)
                except Exception as exc:
                    error = exc
                else:  # (_settle's success, without its call: every request passes here)
                    self._running -= 1
                    self.stats.record_request(True, time.perf_counter_ns() - start)
                    then(response, None)
                    return
            self._settle(start, error)
            then(None, error)

        names = [o.name for o in request.outputs] if request.outputs else self._every_output_name
        scheduler: StraightScheduler = self.scheduler  # type: ignore[assignment]  # (``straight`` says so)
        try:
            pending = scheduler.enqueue(self._runtime_inputs(request), names, batch_size, request.parameters,
                                        finished, request.trace, request.id or "", request.timing)
        except BaseException as exc:
            self._settle(start, exc)
            raise

        def withdraw() -> bool:
            if not scheduler.withdraw(pending):
                return False
            finished(None, asyncio.CancelledError())
            return True

        return withdraw

    def _settle(self, start: int, error: BaseException | None) -> None:
        """A request ``_accept`` took, done (``start``: its ``perf_counter_ns`` then): no longer running, and
        counted as a success or as the failure ``error`` was."""
        self._running -= 1
        if error is None:
            self.stats.record_request(True, time.perf_counter_ns() - start)
        else:
            self.stats.record_request(False, time.perf_counter_ns() - start, _failure_reason(error))

    def _accept(self, request: InferRequest) -> int:
        """A request this version takes, validated and counted as running (and in ``traffic``): its batch
        size. A request of one input and at most one output, neither asking anything of its own (the
        common one), has a form: its input's name, datatype and shape, and the output it names. Every
        check ``validate_request`` makes reads nothing else of it, so a form found valid before is valid
        again and is not checked twice (``ACCEPTED_FORMS`` of them)."""
        if self._decoupled:
            raise InvalidInput(
                f"model '{self.name}' is decoupled (it may send any number of responses per request); call it "
                "through a streaming API: HTTP generate_stream or gRPC ModelStreamInfer"
            )
        inputs, outputs = request.inputs, request.outputs
        form: tuple | None = None
        if len(inputs) == 1:
            tensor = inputs[0]
            if not outputs:
                form = (tensor.name, tensor.datatype, tensor.data.shape, None)
            elif len(outputs) == 1 and "classification" not in outputs[0].parameters:
                form = (tensor.name, tensor.datatype, tensor.data.shape, outputs[0].name)
        known = self._accepted.get(form) if form is not None else None
        item: ItemShapes | None
        if known is not None:
            batch_size, item = known
        else:
            batch_size = validate_request(self.name, self.signature, request)
            item = None
            if form is not None and len(self._accepted) < ACCEPTED_FORMS:
                item = self.traffic.shapes(inputs)
                self._accepted[form] = batch_size, item
        self._running += 1
        if self.selection is not None:  # what retuning on traffic looks at
            # Counted from validation to the result, not while the response is written: one client
            # sending back to back is concurrency 1 however late the server finishes writing to it.
            self.traffic.record(item or self.traffic.shapes(inputs), batch_size, self._running)
        return batch_size

    def _runtime_inputs(self, request: InferRequest) -> dict[str, np.ndarray]:
        inputs = {t.name: t.data for t in request.inputs}
        if self._input_reshape:
            for name, shape in self._input_reshape.items():
                if name in inputs:
                    inputs[name] = inputs[name].reshape(shape)
        return inputs

    async def _run(self, request: InferRequest, batch_size: int) -> InferResponse:
        # No outputs named: every output the model has, none classified.
        names = [o.name for o in request.outputs] if request.outputs else self._every_output_name
        if self.response_cache is not None:
            results = await self._cached(request, names, batch_size, self.response_cache)
        else:
            results = await self._submit(request, names, batch_size)
        return self._response(request, results)

    def _response(self, request: InferRequest, results: Mapping[str, np.ndarray]) -> InferResponse:
        # An output the model did not produce is left out of the response, as Triton does (a Python model
        # may answer with some of its outputs; an ensemble step may, and the ensemble passes that on).
        outputs = self._outputs(results, request.outputs)
        # A model may set response parameters (Triton's Python InferenceResponse(parameters=...)).
        parameters = dict(results.parameters) if type(results) is Outputs and results.parameters else {}
        return InferResponse(self.name, self.version, outputs, request.id, parameters)

    def _outputs(self, results: Mapping[str, np.ndarray],
                 requested: Sequence[RequestedOutput]) -> list[InferOutput]:
        """The response's outputs: those the request named, in its order, or (none named) every one the
        model produced. An output the model did not produce is left out."""
        if not requested and self._produced_order is not None:
            every = self._produced_order
            if not self._output_reshape:  # as the model made them (an output named by none has no classification)
                return [InferOutput(name, v2_datatype(value.dtype), value) if type(value) is np.ndarray
                        else self._output(every[name], value)
                        for name, value in results.items() if value is not None and name in every]
            return [self._output(every[name], value) for name, value in results.items()
                    if value is not None and name in every]
        return [self._output(o, results[o.name]) for o in requested or self._every_output
                if results.get(o.name) is not None]

    def _submit(self, request: InferRequest, names: list[str], batch_size: int) -> Any:
        return self.scheduler.submit(self._runtime_inputs(request), names, batch_size, request.parameters,
                                     request.trace, request.timing, request_id=request.id or "",
                                     cancelled=request.cancelled)

    async def _cached(self, request: InferRequest, names: list[str], batch_size: int,
                      cache: ResponseStore) -> Mapping[str, np.ndarray]:
        """The model's outputs from the response cache, or from the model (then kept): a hit never
        queues. Counted as Triton counts them: a hit's time is its lookup, a miss's its lookup and insert."""
        started = time.perf_counter_ns()
        parameters = model_parameters(request.parameters) if request.parameters else ""
        key = cache.key(self._cache_owner, request.inputs, names, "" if parameters == "{}" else parameters)
        looked_up = time.perf_counter_ns()
        stored = await cache.fetch(key, looked_up - started, self._output_forms, batch_size)
        if stored is not None:
            self.stats.record_cache_hit(time.perf_counter_ns() - started)
            return stored
        lookup_ns = time.perf_counter_ns() - started
        results = await self._submit(request, names, batch_size)
        inserting = time.perf_counter_ns()
        stored = cache.store(key, self._cache_owner, results,
                             results.parameters if isinstance(results, Outputs) else None, self._output_forms,
                             batch_size)
        insert_ns = time.perf_counter_ns() - inserting
        cache.record_insertion(insert_ns)
        self.stats.record_cache_miss(lookup_ns + insert_ns)
        return stored if stored is not None else results

    def _output(self, requested: RequestedOutput, data: np.ndarray) -> InferOutput:
        name = requested.name
        data = np.asarray(data) if not isinstance(data, np.ndarray) else data
        if self._output_reshape and name in self._output_reshape:
            data = data.reshape(self._output_reshape[name])
        if "classification" in requested.parameters and requested.classification:
            data = classify(name, data, requested.classification, self.labels.get(name, []), self.signature.batched)
        return InferOutput(name, v2_datatype(data.dtype), data)

    async def open_stream(self, request: InferRequest, limits: StreamLimits | None = None,
                          account: tuple[Callable[[int], None], Callable[[int], None]] | None = None) -> ResponseStream:
        """Validate and queue one request to a decoupled model; its responses come from the returned
        stream (see appliance.engine.streaming). Counted in ``stats`` once, when the stream ends.
        ``account``: (reserve, release) of the request's memory account, for the responses not yet read."""
        if not self.decoupled:
            raise InvalidInput(f"model '{self.name}' is not decoupled; it answers each request once through infer")
        batch_size = validate_request(self.name, self.signature, request)
        start = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        limits = limits or StreamLimits()
        channel = ResponseChannel(f"{self.name}:{self.version}", loop, limits, *(account or ()))
        inputs = self._runtime_inputs(request)
        names = [o.name for o in request.outputs] if request.outputs else self._every_output_name
        asked = request.cancelled
        cancelled = channel.cancelled if asked is None else (lambda: channel.cancelled() or asked())
        submitted = asyncio.ensure_future(self.scheduler.submit(
            inputs, names, batch_size, request.parameters, request.trace, request.timing,
            request_id=request.id or "", sink=channel, cancelled=cancelled))

        def ran(task: asyncio.Future) -> None:
            # run_requests returned: responses may still follow (Triton), unless it failed the request.
            if not task.cancelled() and task.exception() is not None:
                channel.fail(task.exception())  # type: ignore[arg-type]

        deadline: asyncio.TimerHandle | None = None
        if limits.deadline > 0:
            deadline = loop.call_later(limits.deadline, self._expire, channel, submitted, limits.deadline)

        def closed(error: BaseException | None) -> None:
            if deadline is not None:
                deadline.cancel()
            self._streams.discard(channel)
            if isinstance(error, asyncio.CancelledError) and not submitted.done():
                submitted.cancel()  # the client went away: a request still queued never runs
            if error is None:
                self.stats.record_request(True, time.perf_counter_ns() - start)
            else:
                self.stats.record_request(False, time.perf_counter_ns() - start, _failure_reason(error))

        submitted.add_done_callback(ran)
        self._streams.add(channel)
        convert = functools.partial(self._stream_response, requested=request.outputs, request_id=request.id)
        return ResponseStream(channel, convert, closed, submitted)

    def _expire(self, channel: ResponseChannel, submitted: asyncio.Future, seconds: float) -> None:
        channel.expire(DeadlineExceeded(
            f"model '{self.name}' sent no final response within request_deadline ({seconds:g} s); the request "
            "was cancelled (raise request_deadline if the model needs longer, or make it send its final flag)"))
        if not submitted.done():  # still queued: it never runs; running: the model sees is_cancelled()
            submitted.cancel()

    def _stream_response(self, raw: RawResponse, requested: Sequence[RequestedOutput],
                         request_id: str | None) -> InferResponse:
        """One response of a decoupled model: the requested outputs it carries (a decoupled model may send
        a response with only some of them), post-processed as ``infer`` does."""
        outputs = self._outputs(raw.outputs or {}, requested)
        return InferResponse(self.name, self.version, outputs, id=request_id, parameters=dict(raw.parameters or {}))

    @property
    def users(self) -> int:
        """Requests holding this version now (see ``in_use``)."""
        return self._users

    def in_use(self) -> _InUse:
        """Held by a request from lookup to response: a version being replaced or unloaded waits for
        every request that already chose it, even one still reading its body. (``hold`` and ``let_go``
        without the context manager, for a request that lets go from a callback.)"""
        return _InUse(self)

    def hold(self) -> ModelVersion:
        """``in_use`` entered: this version, held until ``let_go``."""
        self._users += 1
        return self

    def let_go(self) -> None:
        """``in_use`` exited: one hold (``hold``) let go of."""
        self._users -= 1

    async def drain(self, timeout: float) -> bool:
        """Wait (bounded) until no request holds this version and its queue and instances are idle."""
        deadline = time.monotonic() + timeout
        while self._users and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await self.scheduler.drain(max(0.0, deadline - time.monotonic()))

    async def close(self, timeout: float | None = None) -> list[BaseException]:
        if self.response_cache is not None:
            self.response_cache.forget(self._cache_owner)
        for channel in list(self._streams):  # the model's process is about to go: no final response will come
            channel.fail(Unavailable(f"model {self.name} version {self.version} was unloaded before it finished "
                                     "this request's responses"))
        return await self.scheduler.close(timeout)


class _InUse:
    """``ModelVersion.in_use``: a class rather than a generator, as every request enters one."""

    __slots__ = ("_version",)

    def __init__(self, version: ModelVersion) -> None:
        self._version = version

    def __enter__(self) -> ModelVersion:
        return self._version.hold()

    def __exit__(self, *exc_info: object) -> None:
        self._version.let_go()
