"""The one small interface every runtime implements.

A backend instance is one loaded copy of one model version on one device. The core calls it from a
thread that belongs to that instance alone, so a backend never needs its own locking.

The scheduler hands each batch to ``run_requests``: by default the requests are concatenated along the
batch dimension, run once by ``run`` and split back (what Triton's tensor backends do); a runtime whose
API takes requests one by one (Triton's Python backend) overrides ``run_requests`` instead.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from appliance.core.errors import BackendUnavailable, InferenceFailed, InvalidInput
from appliance.core.kept import KEPT_KEY_SETS, kept_keys, remember
from appliance.core.tensors import RuntimeTensor

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from appliance.backends.children import ChildProcesses
    from model_cache.environments import UnpackLimits

__all__ = [
    "Backend",
    "BackendInfo",
    "BackendRequest",
    "BackendServices",
    "BatchResult",
    "CALLS_UNAVAILABLE",
    "calls_stopped_tuning",
    "LoadContext",
    "ModelMetrics",
    "ModelCall",
    "ModelCalls",
    "Outputs",
    "model_parameters",
    "RESCHEDULE",
    "RequestResult",
    "Reschedule",
    "ResponseSink",
    "StreamedCall",
    "not_cancelled",
    "reschedule_refused",
    "RuntimeOptions",
    "threads_per_instance",
    "usable_cores",
]


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """The daemon-wide runtime choices a backend may use (from Settings)."""

    onnx_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0
    thread_hop_ns: int = 0
    """The measured round trip from the event loop to an instance thread (0: not measured): a plan
    whose batches are faster runs inline (see appliance.engine.scheduler.execution)."""


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_instance(options: RuntimeOptions, instances: int) -> int:
    """Share this box's cores among a model's instances unless the settings fix a number."""
    if options.intra_op_threads:
        return options.intra_op_threads
    return max(1, usable_cores() // max(instances, 1))


@dataclasses.dataclass(frozen=True, slots=True)
class LoadContext:
    """Everything a backend needs to load one instance of one model version."""

    model_name: str
    version: int
    model_file: Path
    config: ModelConfig
    options: RuntimeOptions
    instance_index: int = 0
    threads: int = 0
    """Threads this instance may use inside one operator (0 = the runtime's default)."""
    artefacts: Path | None = None
    """A model-cache directory where the runtime keeps (and on later starts finds) compiled artefacts."""
    services: BackendServices | None = None
    """What the daemon lends the backend (None in the CLI's tools and where nothing is lent)."""
    plan: str = ""
    """The id of the plan selection serves or measures this instance with ('': the config as it is). Set
    by the loader and selection's tuning bench, never from a config: a plan that changes what the daemon
    trusts (the Python backend's in-process plan) reaches its backend this way only, as anyone who may
    write or push a config writes its parameters."""

    @property
    def version_dir(self) -> Path:
        return self.model_file.parent

    def parameter(self, key: str) -> str | None:
        """A string parameter of the model config (where plans and users pass runtime options: the same
        channel, so never one that only the daemon may choose; see ``plan``)."""
        value = self.config.parameters.get(key)
        return value.string_value if value is not None and value.string_value else None


class ResponseSink(Protocol):
    """Where the responses of one request to a decoupled model go: zero, one or many, from any thread,
    during or after ``run_requests``; the last one carries ``final=True`` (it may hold no outputs).

    ``send`` may block the calling thread while the client is behind in reading (backpressure, see
    appliance.engine.streaming), so call it from the backend's own threads, never from the event loop;
    on the event loop call ``offer``, which never blocks."""

    def send(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
             parameters: Mapping[str, object] | None = None, final: bool = False) -> None: ...

    def offer(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
              parameters: Mapping[str, object] | None = None, final: bool = False) -> Awaitable[object] | None:
        """``send`` on the event loop: None once the response is taken; while the client is behind, an
        awaitable that takes it once there is room — send nothing more of this request's until then."""
        ...

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error`` now, whatever the client has read (what was sent before still
        reaches it): the producer is gone. Never blocks; any thread."""
        ...


@dataclasses.dataclass(slots=True)
class ModelCall:
    """One request a backend makes to another model of this server (Triton's BLS). Not frozen: one is
    made per call, and a frozen dataclass sets each of its fields through ``object.__setattr__``."""

    model_name: str
    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str] = ()
    """Outputs wanted; empty means all of them."""
    model_version: int = -1
    """-1: the newest ready version."""
    request_id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class StreamedCall(Protocol):
    """A streamed call to another model, in flight (what ``ModelCalls.stream`` returns)."""

    def cancel(self) -> None:
        """Ask the called model to stop: its ``request.is_cancelled()`` turns True, and its responses
        keep coming until its final one (Triton's ``ResponseIterator.cancel()``: a request, not a cut)."""

    def abandon(self) -> None:
        """Nobody reads the responses any more (the caller is gone): cancel the request and drop them."""


class ModelCalls(Protocol):
    """The daemon's models as a backend may call them: through the same schedulers as every other
    request (they batch together and count in the statistics). Every method may be called from any
    thread; none blocks on the model it calls."""

    def begin(self, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
        """Run ``call``: ``then(outputs, error)`` is called once with its outputs or its error (an
        ApplianceError carrying the status a client would get), in the step that has them (for a caller on
        the event loop, the called model's straight line, with nothing between its result and ``then``)."""

    def stream(self, call: ModelCall, sink: ResponseSink) -> StreamedCall:
        """Every response of the call goes to ``sink`` (one then final for a model that is not
        decoupled)."""

    def ready(self, name: str, version: str = "") -> bool: ...

    def load(self, name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> Future[None]:
        """Load (or reload) ``name``, with a config override (JSON) and, with ``files``
        (``{"file:1/model.onnx": b"..."}``), from those files instead of the repository's: a push, kept and
        bounded as the load API's pushes are."""

    def push_limits(self) -> tuple[int, int] | None:
        """(largest file, all pushed files together) in bytes that ``load(files=...)`` accepts; None when
        it accepts no files."""

    def unload(self, name: str, unload_dependents: bool = False) -> Future[None]: ...


class ModelMetrics(Protocol):
    """The metric families models define (Triton's custom metrics), as the daemon keeps them for
    /metrics (``appliance.metrics.custom.CustomMetrics``). ``owner`` is whatever defines them (a model
    process); ``release`` drops what only it used. Invalid names or kinds raise ValueError."""

    def family(self, owner: object, name: str, description: str, kind: int) -> None: ...

    def metric(self, owner: object, name: str, labels: dict[str, str], buckets: Sequence[float] | None) -> int: ...

    def update(self, metric_id: int, operation: str, value: float) -> None: ...

    def value(self, metric_id: int) -> float: ...

    def release(self, owner: object) -> None: ...


CALLS_UNAVAILABLE = "calling models (BLS) is not available here"
"""The error a model's call to another model gets where no ``BackendServices.models`` is lent (the tuning
child): no traffic can make such a model measurable there (see appliance.repository.retune)."""


def calls_stopped_tuning(refused: list[dict[str, str]]) -> bool:
    """Whether only the model's calls to other models (which tuning cannot serve) made it refuse every
    tuning input (``refused``: selection's ``inputs_refused``): no other input, and no traffic, would
    measure it."""
    return bool(refused) and all(CALLS_UNAVAILABLE in r.get("reason", "") for r in refused)


@dataclasses.dataclass(frozen=True, slots=True)
class BackendServices:
    """What the daemon lends its backends, made once by the composition root."""

    models: ModelCalls | None = None
    """The daemon's models, for backends whose models call models (Triton's BLS); None: such calls fail
    with ``CALLS_UNAVAILABLE``."""
    metrics: ModelMetrics | None = None
    """Metric families a model defines, exported on /metrics."""
    processes: ChildProcesses | None = None
    """Child processes a backend starts, which the daemon ends at stop (within exit_timeout)."""
    environments: Path | None = None
    """Where Python models' packed environments are unpacked (``EXECUTION_ENV_PATH``; the model cache's
    ``environments``); None: a temporary directory."""
    environment_limits: UnpackLimits = dataclasses.field(default_factory=lambda: _unpack_limits())
    """How much one packed environment may unpack to (the settings environment_max_*)."""


def _unpack_limits() -> UnpackLimits:
    """The default limits, imported when first asked for: this module is imported by every model process
    (through its package), and model_cache.environments brings tarfile, zipfile and the compressors (~6 MiB
    a process) that only the daemon needs."""
    from model_cache.environments import UnpackLimits

    return UnpackLimits()


class Outputs(dict[str, np.ndarray]):
    """One request's outputs, with the response parameters the model set (Triton's
    ``InferenceResponse(parameters=...)``), which go back to the client."""

    def __init__(self, tensors: Mapping[str, np.ndarray], parameters: Mapping[str, object] | None = None) -> None:
        super().__init__(tensors)
        self.parameters: Mapping[str, object] = dict(parameters) if parameters else {}


def not_cancelled() -> bool:
    """The cancellation probe of a request nobody can cancel."""
    return False


@dataclasses.dataclass(slots=True)
class BackendRequest:
    """One request of a batch, as a backend sees it (not frozen: one is made per request, and a frozen
    dataclass sets each of its fields through ``object.__setattr__``)."""

    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str]
    """The outputs this request asked for."""
    parameters: Mapping[str, object] = dataclasses.field(default_factory=dict)
    size: int = 1
    """Batch items it holds (the first dimension of its inputs when the model batches)."""
    request_id: str = ""
    correlation_id: int | str = 0
    """The sequence this request belongs to (0 when none)."""
    flags: int = 0
    """Triton's sequence flags: 1 = START, 2 = END."""
    timeout_us: int = 0
    """The client's timeout for this request, 0 when it set none."""
    sink: ResponseSink | None = None
    """Set for a request to a decoupled model: every response goes here, and the request's entry in
    ``BatchResult.results`` is ignored unless it is an exception (sent as an error, then final)."""
    cancelled: Callable[[], bool] = not_cancelled
    """True once the client went away or cancelled (Triton's ``request.is_cancelled()``)."""
    padding: bool = False
    """A row that fills an empty slot of a sequence batch (Triton's null request): its result is ignored."""


# Request parameters that steer the transport or the scheduler, not the model: request.parameters()
# leaves them out, as Triton's does.
_TRANSPORT_PREFIXES = ("shared_memory_", "binary_data", "sequence_", "triton_")
_TRANSPORT_KEYS = frozenset({"priority", "timeout", "headers"})


_TRANSPORT_ONLY: dict[tuple[str, ...], bool] = {}
"""Key sets that hold none of the request's own parameters (a sequence's steps: the sequence's keys
alone, every step); only small key sets are kept (``kept_keys``)."""


def model_parameters(parameters: Mapping[str, object]) -> str:
    """The request's own parameters as the JSON text ``request.parameters()`` returns."""
    if not parameters:
        return "{}"
    keys = tuple(parameters)
    if keys in _TRANSPORT_ONLY:
        return "{}"
    kept = {key: value for key, value in parameters.items()
            if key not in _TRANSPORT_KEYS and not key.startswith(_TRANSPORT_PREFIXES)}
    if kept:
        return json.dumps(kept, default=str)
    if kept_keys(keys):
        remember(_TRANSPORT_ONLY, keys, True, KEPT_KEY_SETS)
    return "{}"


class Reschedule:
    """The result of a request the model released with Triton's TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
    it runs again in a later batch (a model with ``sequence_batching { iterative_sequence: true }``; any
    other model's backend fails such a request with ``reschedule_refused``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULE"


RESCHEDULE = Reschedule()

RequestResult: TypeAlias = "dict[str, np.ndarray] | BaseException | Future[dict[str, np.ndarray]] | Reschedule"
"""One request's result in a batch: its outputs; the error that failed it alone; a future of its outputs
when the model answers after the batch returned (a Python model's response sender); or RESCHEDULE."""


def reschedule_refused(model: str) -> InvalidInput:
    """Triton's error (its words first) for a request released with RESCHEDULE by a model whose scheduler
    cannot run it again."""
    return InvalidInput(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to "
        f"handle such a flag. (model '{model}': add sequence_batching {{ iterative_sequence: true }} to its "
        "config, or do not call request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE))"
    )


@dataclasses.dataclass(slots=True)
class BatchResult:
    """One result per request, in order (see ``RequestResult``). A backend that can tell reports how long
    it spent gathering inputs and scattering outputs (Triton's compute_input and compute_output); the
    rest of the call counts as inference."""

    results: list[RequestResult]
    input_ns: int = 0
    output_ns: int = 0
    failed: frozenset[int] = frozenset()
    """Requests run alone (``start_each``) whose execution failed as a whole (the model raised): Triton
    counts such an execution, but no inference. Their results are the errors."""


def _gather_inputs(requests: Sequence[BackendRequest]) -> Mapping[str, np.ndarray]:
    if len(requests) == 1:
        return requests[0].inputs
    return {name: np.concatenate([r.inputs[name] for r in requests]) for name in requests[0].inputs}


def _split_outputs(
    results: Mapping[str, np.ndarray], requests: Sequence[BackendRequest]
) -> list[dict[str, np.ndarray]]:
    if len(requests) == 1:
        return [{name: results[name] for name in requests[0].outputs if name in results}]
    total = sum(r.size for r in requests)
    for name, value in results.items():
        if np.ndim(value) == 0 or value.shape[0] != total:
            raise InferenceFailed(
                f"output '{name}' has shape {list(np.shape(value))}, but the batch held {total} items; "
                "the model does not return one row per batch item, so it cannot be batched "
                "(remove dynamic_batching or set max_batch_size: 0)"
            )
    bounds = np.cumsum([0, *(r.size for r in requests)])
    return [
        {name: results[name][bounds[i] : bounds[i + 1]] for name in r.outputs if name in results}
        for i, r in enumerate(requests)
    ]


class Backend(abc.ABC):
    """One loaded model instance."""

    pipeline_depth: int = 1
    """Batches this instance may be handed before the first completes: more than 1 for a backend whose
    ``start_requests`` sends batches to another process, which queues them and runs them in order (the
    next one is there when the current one ends). The scheduler uses it for models without dynamic
    batching, whose batches would not grow by waiting."""

    group_limit: int = 1
    """Requests of a model without dynamic batching this instance takes in one ``start_each`` call and
    runs one at a time, in order (each its own execution, as Triton's default scheduler runs them): what a
    hand-off to another process costs is paid once per group, not per request. 1: never grouped."""

    inline_safe: bool | None = None
    """Whether a batch may run on the event loop's own thread (when measured fast enough, see
    appliance.engine.scheduler.execution): None leaves it to ``BackendInfo.in_process``. An instance that
    knows better says so (the in-process Python plan), and may turn it False while it serves, for good."""
    inline_refusal: str = ""
    """Why not, when ``inline_safe`` is False (shown in /selection)."""
    holds_gil: bool = False
    """A batch is Python code under the GIL: a thread would not run it beside the event loop, so running
    it there is judged by its length alone, not against the hop to a thread."""

    @abc.abstractmethod
    def inputs(self) -> Sequence[RuntimeTensor] | None:
        """The runtime's description of the model inputs; None when the file does not say (the
        config must then declare them)."""

    @abc.abstractmethod
    def outputs(self) -> Sequence[RuntimeTensor] | None:
        """The runtime's description of the model outputs; None when the file does not say."""

    @abc.abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Execute one batch given as tensors. BYTES tensors are numpy object arrays of ``bytes`` both ways.

        Raise ``appliance.core.errors.InvalidInput`` for input the runtime refuses and
        ``appliance.core.errors.InferenceFailed`` for anything else that goes wrong.
        """

    def run_requests(self, requests: Sequence[BackendRequest]) -> BatchResult:
        """Execute the requests of one batch (the scheduler's entry point).

        This default concatenates their inputs along the batch dimension, runs them once with ``run``
        and splits the outputs back per request; an error fails the whole batch. Override it where the
        runtime takes requests separately and may fail each one on its own.
        """
        start = time.perf_counter_ns()
        feed = _gather_inputs(requests)
        gathered = time.perf_counter_ns()
        outputs = list(dict.fromkeys(name for r in requests for name in r.outputs))
        results = self.run(feed, outputs)
        ran = time.perf_counter_ns()
        split: list[RequestResult] = list(_split_outputs(results, requests))
        return BatchResult(split, input_ns=gathered - start, output_ns=time.perf_counter_ns() - ran)

    def start_requests(self, requests: Sequence[BackendRequest],
                       done: Callable[[BatchResult | BaseException], None]) -> bool:
        """Start the requests of one batch without blocking the caller (the event loop), for a backend
        whose batch runs elsewhere (another process): ``done`` is called once, from any thread, with the
        batch's result or the exception that failed it. Return False, without calling ``done``, when it
        cannot start that way right now (e.g. it must first restart something, or the inputs are large):
        the scheduler then runs ``run_requests`` on the instance's thread. This default never starts."""
        return False

    def start_each(self, requests: Sequence[BackendRequest],
                   done: Callable[[BatchResult | BaseException], None]) -> bool:
        """As ``start_requests``, for a group of requests that run one at a time, each its own execution
        (up to ``group_limit``; see there): ``done`` gets one result per request, with those whose execution
        failed in ``BatchResult.failed``. False when it cannot start them that way now: the scheduler then
        runs them one by one with ``run_requests`` on the instance's thread. This default never starts."""
        return False

    def close(self) -> None:  # noqa: B027 - most runtimes free themselves when dropped
        """Release what the instance holds."""

    def completed_config(self, config: ModelConfig) -> ModelConfig:
        """The config as the model itself completes it (Triton's Python ``auto_complete_config``);
        most runtimes leave that to the core and return it unchanged."""
        return config

    def configure(self, config: ModelConfig) -> None:  # noqa: B027 - only some backends care
        """Called once with the final, auto-completed config before the first run."""

    def check_ready(self) -> None:  # noqa: B027 - only runtimes in another process can be lost
        """Called once every instance is configured and warmed up, right before the version is served:
        a runtime that lives in another process makes sure it still does (or raises ConfigError, which
        fails the load), so that the first request does not find it gone."""


@dataclasses.dataclass(frozen=True, slots=True)
class BackendInfo:
    """How to find and load a backend; the runtime module is imported only when a model needs it."""

    name: str
    platforms: tuple[str, ...]
    default_filename: str
    module: str
    factory: str
    extra: str
    cpu_instances: int = 1
    """Instances per CPU instance group when the config names no count (Triton: 2 for onnxruntime)."""
    decoupled: bool = False
    """It serves decoupled models: it sends each request's responses to ``BackendRequest.sink``."""
    in_process: bool = True
    """The runtime computes in this process: a batch never waits on another process, so a fast one may
    run on the event loop (the Python backend's model runs in a process of its own)."""
    reads_file: bool = True
    """It loads the model from ``default_filename`` in the version directory. False: the config is the
    whole model (Triton's identity backend), an empty version directory serves, and a model is never
    taken for one of its models by the files it holds."""

    @property
    def platform(self) -> str:
        return self.platforms[0]

    def load(self, context: LoadContext) -> Backend:
        try:
            module = importlib.import_module(self.module)
        except ImportError as exc:
            raise BackendUnavailable(
                f"backend {self.name!r} is unavailable: {exc.name or exc} is not installed; "
                f"install the '{self.extra}' extra (pip install 'edge-appliance[{self.extra}]')"
            ) from exc
        return getattr(module, self.factory)(context)
