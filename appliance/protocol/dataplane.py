"""The data plane: the one way in for every transport.

One method per operation of the protocol (``appliance.protocol.operations``). Each owns what is not
about wire formats: admission (``admit``, before the request's bytes are held), lookup and hold of the
model, the memory budget, the refusals, decoding off the event loop, shared memory, tracing; each
returns a typed result (``appliance.protocol.results``) or a protobuf message of Triton's model config.
REST and gRPC turn their wire bytes into the arguments and the result into wire bytes, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from appliance import __version__
from appliance.core.errors import InvalidInput, ModelNotFound, ModelNotReady, NotSupported, Unavailable
from appliance.engine.model import ModelVersion
from appliance.engine.streaming import Responses, StreamLimits
from appliance.engine.tensor_checks import DecodeLimits
from appliance.protocol.admission import AccessPolicy, Admission, Caller
from appliance.protocol.inference import NOT_SERVED, Inference, InferSource, OneInference
from appliance.protocol.log_settings import LogSettings, LogValues
from appliance.protocol.operations import Operation
from appliance.protocol.repository_control import RepositoryControl
from appliance.protocol.results import (
    Health,
    IndexEntry,
    ModelMetadata,
    RegionStatus,
    ServerMetadata,
    TensorMetadata,
    VersionStatistics,
)
from appliance.protocol.shared_memory import SharedMemoryRegistry
from appliance.protocol.trace_settings import TraceSettings
from appliance.protocol.tracing import Tracer
from appliance.repository.config import as_reported
from appliance.repository.pushed import PushStore
from appliance.repository.registry import ModelRegistry, ModelState
from appliance.runtime.state import StateDir
from appliance.security.budget import Account, MemoryBudget
from appliance.security.fleet_signature import NONCE_TTL, SCHEME

__all__ = ["EXTENSIONS", "SERVER_NAME", "DataPlane", "Rules"]

# Triton's own clients check the name (simple_http_health_metadata.py: name == "triton"); the version is
# this server's own. docs/differences-from-triton.md.
SERVER_NAME = "triton"
# Triton's extensions in Triton's order; the shared-memory ones only where they are served (see
# SharedMemoryRegistry.extensions). docs/differences-from-triton.md.
EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
_SHARED_MEMORY = frozenset({"system_shared_memory", "cuda_shared_memory"})


@dataclasses.dataclass(frozen=True, slots=True)
class Rules:
    """How the data plane serves, from the settings."""

    control_mode: str = "none"
    """Triton's model control mode: none, poll or explicit (load and unload over the API)."""
    strict_readiness: bool = True
    """Ready only when every model is ready (as Triton)."""
    decode: DecodeLimits = DecodeLimits()
    streams: StreamLimits = StreamLimits()
    box_name: str = ""
    """The name this box goes by (the fleet name, else the host's), shown in /v2/health."""
    host: str = ""
    """The host's name, shown in /v2/health."""
    server_id: str = SERVER_NAME
    """The server's name in server metadata (the server_id setting, Triton's --id)."""


class DataPlane:
    def __init__(self, registry: ModelRegistry, rules: Rules = Rules(), *, admission: Admission | None = None,
                 budget: MemoryBudget | None = None, shared_memory: SharedMemoryRegistry | None = None,
                 tracer: Tracer | None = None, traces: TraceSettings | None = None, logs: LogSettings | None = None,
                 pushes: PushStore | None = None, state: StateDir | None = None,
                 hardware: asyncio.Future[dict[str, Any]] | None = None) -> None:
        """``admission``: the access policy and request bound (default: a token nobody knows, no bound
        worth the name); ``shared_memory``: the registered regions, None serves no shared memory at all;
        ``tracer``: samples requests for Triton's trace extension, None traces nothing; ``pushes``: where
        pushed models are kept, None refuses pushes; ``hardware``: the hardware probe's report, once the
        start-up probe has run."""
        self._registry = registry
        self._rules = rules
        self._admission = admission or Admission(AccessPolicy(token=""))
        budget = budget or MemoryBudget(1 << 62)
        self._shared_memory = shared_memory
        self._traces = traces or TraceSettings()
        self._logs = logs or LogSettings(logging.getLogger(), LogValues())
        self._state = state
        self._hardware = hardware
        self._inference = Inference(registry, budget, rules.decode, shared_memory=shared_memory, tracer=tracer,
                                    stream_limits=rules.streams)
        # The two steps every request takes are the parts' own methods (no forwarding step in between).
        self.admit = self._admission.admit
        """Held while one request is handled; a transport asks before it reads the request's bytes.
        Entering gives the SHA-256 (hex) a signed request's body must have (None: not signed), which the
        transport checks as it reads the body. See ``Admission.admit`` (its ``proof``)."""
        self.begin = self._inference.begin
        """``infer`` without a task for a request whose bytes are in hand, where it applies (None: use
        ``infer``). See ``Inference.begin``."""
        self.takes = self._inference.takes
        """Whether ``begin`` would take a request to a target now. See ``Inference.takes``."""
        self.straight = self._inference.straight
        """``begin`` for a caller that awaits (its request has a task anyway). See ``Inference.straight``."""
        self._repository = RepositoryControl(registry, control_mode=rules.control_mode, pushes=pushes)
        self._loaded = asyncio.Event()
        self.failure: str | None = None
        """Why the server stopped being live (None while it is)."""

    @property
    def rules(self) -> Rules:
        return self._rules

    # Server state

    @property
    def loaded(self) -> bool:
        """True once the repository has been loaded (successfully or not) at start-up."""
        return self._loaded.is_set()

    def mark_loaded(self) -> None:
        self._loaded.set()

    async def wait_loaded(self) -> None:
        await self._loaded.wait()

    def fail(self, reason: str) -> None:
        """The server cannot recover by itself (its repository load died): not live from now on."""
        self.failure = reason

    def status_line(self) -> str:
        entries = self._registry.entries()
        loading = sum(1 for e in entries if e.state is ModelState.LOADING)
        failed = sum(1 for e in entries if e.state is ModelState.UNAVAILABLE and e.wanted)
        idle = sum(1 for e in entries if e.state is ModelState.UNAVAILABLE and not e.wanted)
        line = f"{self._registry.ready_count()} models ready, {loading} loading/tuning, {failed} failed"
        return line + (f", {idle} not loaded" if idle else "")

    # Admission

    def check_access(self, operation: Operation, caller: Caller) -> None:
        """The access policy alone (for each request read from an open stream, admitted with the stream)."""
        self._admission.check(operation, caller)

    def fleet_nonce(self) -> dict[str, Any]:
        """This box's id and a fresh nonce for one signed request (appliance.security.fleet_signature)."""
        signatures = self._admission.policy.signatures
        if signatures is None:
            raise NotSupported("this server takes no signed requests; send the bearer token")
        return {"id": signatures.box_id, "nonce": signatures.nonce(), "expires_in": NONCE_TTL, "scheme": SCHEME}

    # Health and metadata

    def live(self) -> bool:
        return self.failure is None

    def ready(self) -> bool:
        if not self.loaded:
            return False
        return self._registry.all_ready if self._rules.strict_readiness else True

    def health(self) -> Health:
        state = self._state.to_json() if self._state is not None else {}
        return Health(self.live(), self.ready(), self.failure, state,
                      {"name": self._rules.box_name, "host": self._rules.host})

    def server_metadata(self) -> ServerMetadata:
        served = set(self._shared_memory.extensions()) if self._shared_memory is not None else set()
        return ServerMetadata(self._rules.server_id, __version__,
                              tuple(name for name in EXTENSIONS if name not in _SHARED_MEMORY or name in served))

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """False for a model or version that does not serve (unknown ones too, as Triton answers);
        raises InvalidInput for a version that is not a number."""
        try:
            self._registry.get(name, version)
        except (ModelNotReady, ModelNotFound):
            return False
        return True

    def _serving(self, name: str, version: str | None) -> ModelVersion:
        """The version that serves. For a model the repository has that a request would load
        (load_on_demand), Triton's refusal (its words and status) says so."""
        try:
            return self._registry.get(name, version)
        except ModelNotFound as error:
            if "load_on_demand" in error.message or not self._registry.residency.on_demand(name):
                raise
            raise ModelNotFound(f"{error.message}; it is in the repository, not loaded: an inference request loads "
                                "it (load_on_demand)") from None

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        model = self._serving(name, version)
        entry = self._registry.entry(name)
        signature = model.signature

        def tensors(specs: dict) -> tuple[TensorMetadata, ...]:
            return tuple(TensorMetadata(s.name, s.datatype, tuple(signature.full_shape(s))) for s in specs.values())

        return ModelMetadata(name, tuple(str(v) for v in sorted(entry.versions)), model.platform,
                             tensors(signature.inputs), tensors(signature.outputs))

    def model_config(self, name: str, version: str | None = None) -> mc.ModelConfig:
        """Triton's ModelConfig message of the version that serves, as Triton reports it."""
        return as_reported(self._serving(name, version).config)

    def model_statistics(self, name: str | None = None, version: str | None = None) -> list[VersionStatistics]:
        """Triton's statistics extension: every ready version, one model, or one version."""
        if name is None:
            models = self._registry.ready_versions()
        elif version is None:
            try:
                models = [m for _, m in sorted(self._registry.entry(name).versions.items())]
            except ModelNotFound:
                models = []
            if not models:  # Triton's words and status (INVALID_ARG) for an unknown or unloaded model
                raise InvalidInput(f"requested model '{name[:255]}' is not available")
        else:
            try:
                models = [self._registry.get(name, version)]
            except (ModelNotFound, ModelNotReady) as error:
                raise InvalidInput(f"requested model version is not available for model '{name[:255]}'") from error
        return [VersionStatistics(m.name, str(m.version), m.stats.as_json()) for m in models]

    def model_selection(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Which plan serves the version, how the candidates measured, and whether it came from cache (a
        JSON document: the dashboard's and ``appliance explain``'s)."""
        model = self._registry.get(name, version)
        if model.backend is None:
            return {"model": name, "version": model.version, "status": "ensemble", "chosen": None, "cache": "off",
                    "reason": "an ensemble runs no backend of its own: see the /selection of its composing models",
                    "candidates": []}
        execution = model.scheduler.execution
        if model.selection is None:
            return {"model": name, "version": model.version, "status": "off", "chosen": None, "cache": "off",
                    "reason": "selection is off (--no-selection): the config's backend serves the model",
                    "candidates": [], "execution": execution}
        return {**model.selection, "execution": execution, "traffic": model.traffic.as_json()}

    def hardware(self) -> dict[str, Any]:
        """The hardware probe's report (JSON)."""
        if self._hardware is None or not self._hardware.done():
            raise Unavailable("the hardware probe is still running; try again in a few seconds", retry_after=5)
        return self._hardware.result()

    def memory(self) -> dict[str, Any]:
        """Load on demand, idle unload, the model memory budget and pressure (JSON, docs/memory.md): the
        rules in force, the budget and what the loaded models use of it, what each holds and why it is
        loaded, the loads and unloads by cause, each model's last first-request wait."""
        return self._registry.residency.status()

    # Inference

    def account(self) -> Account:
        """A new account of the memory budget, for bytes a transport must hold before ``infer`` (each
        request read from a stream is counted from the moment it is read)."""
        return self._inference.account()

    def infer(self, caller: Caller, source: InferSource, *, received_ns: int | None = None,
              account: Account | None = None) -> OneInference:
        """``async with plane.infer(caller, source) as result``: encode ``result`` inside the block (the
        model stays held, the request's bytes counted). See ``appliance.protocol.inference``."""
        return self._inference.infer(caller, source, received_ns=received_ns, account=account)

    def infer_stream(self, caller: Caller, source: InferSource, *, received_ns: int | None = None,
                     account: Account | None = None) -> contextlib.AbstractAsyncContextManager[Responses]:
        """``async with plane.infer_stream(caller, source) as responses``: every response of one request."""
        return self._inference.infer_stream(caller, source, received_ns=received_ns, account=account)

    # Model repository

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self._repository.index(ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        await self._repository.load(name, parameters)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        await self._repository.unload(name, parameters or {})

    # Shared memory

    def _regions(self) -> SharedMemoryRegistry:
        if self._shared_memory is None:
            raise NotSupported(NOT_SERVED)
        return self._shared_memory

    def _local(self, caller: Caller) -> bool:
        return self._regions().local_peers.is_local(caller.address, caller.connected_to, direct=caller.direct)

    @property
    def cuda_shared_memory(self) -> bool:
        """Whether CUDA shared memory can work here (a register's body is checked only then)."""
        return self._shared_memory is not None and self._shared_memory.cuda.enabled

    def shared_memory_status(self, kind: str, caller: Caller, name: str | None = None) -> list[RegionStatus]:
        """``kind``: "system" or "cuda"; every region of that kind, or the one named."""
        regions = self._regions()
        table = regions.system if kind == "system" else regions.cuda
        return [RegionStatus.of(fields) for fields in table.status(name, local=self._local(caller))]

    def register_system_shared_memory(self, caller: Caller, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """``key``, ``offset`` and ``byte_size`` as the client sent them (checked by the registry)."""
        self._regions().system.register(name, key, offset, byte_size, local=self._local(caller))

    async def register_cuda_shared_memory(self, caller: Caller, name: str, raw_handle: bytes, device_id: Any,
                                          byte_size: int) -> None:
        local = self._local(caller)
        # Off the loop: the first IPC handle a process opens initialises CUDA (a second or more).
        await asyncio.to_thread(self._regions().cuda.register, name, raw_handle, device_id, byte_size, local=local)

    async def unregister_shared_memory(self, kind: str, caller: Caller, name: str | None = None) -> None:
        """One region of ``kind``, or every one when ``name`` is None; an unknown name is not an error."""
        regions, local = self._regions(), self._local(caller)
        if kind == "system":
            regions.system.unregister(name, local=local)
        else:
            await asyncio.to_thread(regions.cuda.unregister, name, local=local)

    # Trace and log settings

    def trace_settings(self, model: str | None = None,
                       changes: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
        """Triton's trace settings in force (global, or the model's), after applying ``changes`` (all or
        none of them; an empty list clears a setting)."""
        if model is not None:
            try:
                self._registry.get(model)
            except (ModelNotFound, ModelNotReady):  # Triton's words and status for any model not ready
                raise InvalidInput(f"Request for unknown model : {model[:255]}") from None
        if changes:
            return self._traces.update(changes, model)
        return self._traces.get(model)

    def log_settings(self, changes: dict[str, object] | None = None) -> dict[str, bool | int | str]:
        """Triton's log settings, after applying ``changes`` (all or none of them)."""
        return self._logs.update(changes) if changes else self._logs.get()
