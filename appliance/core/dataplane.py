"""What the protocol can ask of the server, free of any transport (REST today, maybe gRPC later)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from appliance import __version__
from appliance.core.config import config_from_json, config_to_json
from appliance.core.model import ModelVersion
from appliance.core.registry import ModelRegistry, ModelState
from appliance.core.shared_memory import SharedMemoryRegistry
from appliance.core.tracing import Tracer
from appliance.core.types import InferRequest, InferResponse
from appliance.errors import ConfigError, InvalidInput, ModelNotReady, NotSupported

__all__ = ["EXTENSIONS", "SERVER_NAME", "DataPlane"]

# Triton's own clients check the name (simple_http_health_metadata.py: name == "triton"); the version is
# this server's own. README: "Differences from Triton".
SERVER_NAME = "triton"
# Only the Triton extensions this server implements (the shared-memory ones are added where they are
# served: see SharedMemoryRegistry.extensions).
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "parameters",
    "schedule_policy",
    "statistics",
    "trace",
]


def _ignore(size: int) -> None:
    pass


class DataPlane:
    def __init__(self, registry: ModelRegistry, *, shared_memory: SharedMemoryRegistry | None = None,
                 strict_readiness: bool = True, control_mode: str = "none", tracer: Tracer | None = None) -> None:
        """``shared_memory``: the registered regions; None serves no shared memory at all. ``tracer``:
        samples requests for Triton's trace extension; None traces nothing."""
        self.registry = registry
        self.tracer = tracer
        self.shared_memory = shared_memory
        self.control_mode = control_mode
        self._strict = strict_readiness
        self._loaded = asyncio.Event()
        self.hardware: dict[str, Any] | None = None
        """The hardware probe report (JSON), once the start-up probe has run."""
        self.failure: str | None = None
        """Why the server stopped being live (None while it is)."""

    @property
    def loaded(self) -> bool:
        """True once the repository has been loaded (successfully or not) at start-up."""
        return self._loaded.is_set()

    def mark_loaded(self) -> None:
        self._loaded.set()

    async def wait_loaded(self) -> None:
        await self._loaded.wait()

    def status_line(self) -> str:
        entries = self.registry.entries()
        loading = sum(1 for e in entries if e.state is ModelState.LOADING)
        failed = sum(1 for e in entries if e.state is ModelState.UNAVAILABLE and e.wanted)
        idle = sum(1 for e in entries if e.state is ModelState.UNAVAILABLE and not e.wanted)
        line = f"{self.registry.ready_count()} models ready, {loading} loading/tuning, {failed} failed"
        return line + (f", {idle} not loaded" if idle else "")

    def live(self) -> bool:
        return self.failure is None

    def fail(self, reason: str) -> None:
        """The server cannot recover by itself (its repository load died): not live from now on."""
        self.failure = reason

    def ready(self) -> bool:
        if not self.loaded:
            return False
        return self.registry.all_ready if self._strict else True

    def server_metadata(self) -> dict[str, Any]:
        extensions = EXTENSIONS + (self.shared_memory.extensions() if self.shared_memory is not None else [])
        return {"name": SERVER_NAME, "version": __version__, "extensions": extensions}

    def model(self, name: str, version: str | None = None) -> ModelVersion:
        return self.registry.get(name, version)

    async def infer(self, model: ModelVersion, request: InferRequest, *, local: bool,
                    reserve: Callable[[int], None] = _ignore, received_ns: int | None = None) -> InferResponse:
        """Run ``request`` on ``model`` (held by the caller with ``in_use``), moving tensors in and out of
        shared-memory regions where the request names them, and tracing it when it is sampled.

        ``local``: whether the client is on this host (see ``SharedMemoryRegistry.local_peers``);
        ``reserve(size)``: the request's memory account, for inputs read from shared memory;
        ``received_ns``: when the front end got the request (``time.monotonic_ns()``), its REQUEST_START."""
        tracer = self.tracer
        request.trace = tracer.start(model.name, model.version, received_ns) if tracer is not None else None
        if request.trace is None:
            return await self._infer(model, request, local, reserve)
        try:
            return await self._infer(model, request, local, reserve)
        finally:
            assert tracer is not None
            tracer.finish(request.trace)

    async def _infer(self, model: ModelVersion, request: InferRequest, local: bool,
                     reserve: Callable[[int], None]) -> InferResponse:
        if not request.uses_shared_memory:
            return await model.infer(request)
        if self.shared_memory is None:
            raise NotSupported("shared memory is not served by this server; send the tensors in the request")
        with await self.shared_memory.bind(request, local=local, reserve=reserve) as binding:
            response = await model.infer(request)
            await binding.write(response)
        return response

    def model_ready(self, name: str, version: str | None = None) -> bool:
        try:
            self.registry.get(name, version)
        except ModelNotReady:
            return False
        return True

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        model = self.registry.get(name, version)
        entry = self.registry.entry(name)
        signature = model.signature

        def tensors(specs: dict) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "datatype": s.datatype, "shape": signature.full_shape(s)}
                for s in specs.values()
            ]

        return {
            "name": name,
            "versions": [str(v) for v in sorted(entry.versions)],
            "platform": model.platform,
            "inputs": tensors(signature.inputs),
            "outputs": tensors(signature.outputs),
        }

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        return config_to_json(self.registry.get(name, version).config)

    def model_statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every ready version, one model, or one version."""
        if name is None:
            models = self.registry.ready_versions()
        elif version is None:
            self.registry.entry(name)
            models = [m for _, m in sorted(self.registry.entry(name).versions.items())]
        else:
            models = [self.registry.get(name, version)]
        return {
            "model_stats": [
                {"name": m.name, "version": str(m.version), **m.stats.as_json()} for m in models
            ]
        }

    def model_selection(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Which plan serves the version, how the candidates measured, and whether it came from cache."""
        model = self.registry.get(name, version)
        execution = model.scheduler.execution
        if model.selection is None:
            return {"model": name, "version": model.version, "status": "off", "chosen": None, "cache": "off",
                    "reason": "selection is off (--no-selection): the config's backend serves the model",
                    "candidates": [], "execution": execution}
        return {**model.selection, "execution": execution, "traffic": model.traffic.as_json()}

    def _check_control(self, action: str) -> None:
        if self.control_mode != "explicit":
            raise InvalidInput(
                f"explicit model {action} is not allowed in model control mode {self.control_mode!r}; "
                "start the daemon with --model-control-mode explicit"
            )

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Triton's repository extension: load (or reload without downtime), optionally with the
        config given as JSON in ``parameters.config`` instead of config.pbtxt."""
        self._check_control("load")
        self.registry.model_dir(name)  # validates the name before anything touches the file system
        if any(key.startswith("file:") for key in parameters):
            raise InvalidInput("file overrides (parameters 'file:...') are not supported; put files in the repository")
        override = None
        if "config" in parameters:
            try:
                override = config_from_json(parameters["config"], name)
            except ConfigError as exc:
                raise ConfigError(f"failed to load '{name}': {exc.message}") from None
        await self.registry.load(name, override)

    async def unload_model(self, name: str) -> None:
        self._check_control("unload")
        self.registry.model_dir(name)
        await self.registry.unload(name)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for entry in self.registry.entries():
            if entry.state is not ModelState.READY:
                if not ready_only:
                    rows.append({"name": entry.name, "state": entry.state.value, "reason": entry.reason})
                continue
            for version in sorted(entry.versions):
                rows.append({"name": entry.name, "version": str(version), "state": "READY", "reason": entry.reason})
            if not ready_only:
                for version, reason in sorted(entry.failures.items()):
                    rows.append(
                        {"name": entry.name, "version": str(version), "state": "UNAVAILABLE", "reason": reason}
                    )
        return rows
