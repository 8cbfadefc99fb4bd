"""What the protocol can ask of the server, free of any transport (REST today, maybe gRPC later)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from appliance import __version__
from appliance.engine.model import ModelVersion
from appliance.engine.streaming import OneResponse, Responses, StreamLimits
from appliance.engine.types import InferRequest, InferResponse
from appliance.errors import ConfigError, InvalidInput, ModelNotReady, NotSupported, PayloadTooLarge
from appliance.protocol.shared_memory import SharedMemoryRegistry
from appliance.protocol.tracing import Tracer
from appliance.repository.config import config_from_json, config_to_json
from appliance.repository.pushed import FILE_PREFIX, PushStore, file_parameters
from appliance.repository.registry import ModelRegistry, ModelState

__all__ = ["EXTENSIONS", "SERVER_NAME", "DataPlane"]

# Triton's own clients check the name (simple_http_health_metadata.py: name == "triton"); the version is
# this server's own. docs/differences-from-triton.md.
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
    "sequence",
    "sequence(string_id)",
    "statistics",
    "trace",
]


def _ignore(size: int) -> None:
    pass


class DataPlane:
    def __init__(self, registry: ModelRegistry, *, shared_memory: SharedMemoryRegistry | None = None,
                 strict_readiness: bool = True, control_mode: str = "none", tracer: Tracer | None = None,
                 stream_limits: StreamLimits | None = None, pushes: PushStore | None = None) -> None:
        """``shared_memory``: the registered regions; None serves no shared memory at all. ``tracer``:
        samples requests for Triton's trace extension; None traces nothing. ``stream_limits``: how far a
        decoupled model may run ahead of a client reading its responses. ``pushes``: where models pushed
        over the load API's file overrides are kept; None refuses file overrides."""
        self.pushes = pushes
        self._push_locks: dict[str, asyncio.Lock] = {}
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
        self.stream_limits = stream_limits or StreamLimits()

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

    async def infer_stream(self, model: ModelVersion, request: InferRequest, *, local: bool,
                           reserve: Callable[[int], None] = _ignore, release: Callable[[int], None] = _ignore,
                           received_ns: int | None = None) -> Responses:
        """Run ``request`` on ``model`` and return its responses to read with ``async for``; ``close()``
        the result when done (closing early cancels the request: the model sees ``is_cancelled()``).

        A decoupled model's responses come as it sends them, the last one final; any other model's one
        response comes as a stream of one. Errors found before the request runs (validation, shared
        memory, a full queue) raise here; later ones arrive as items with ``error`` set. The arguments
        are ``infer``'s (``release`` gives back part of what ``reserve`` took: responses not yet read count
        against the request's account), and ``model`` must stay held (``in_use``) until the stream is
        closed, and the account open."""
        if not model.decoupled:
            return OneResponse(await self.infer(model, request, local=local, reserve=reserve,
                                                received_ns=received_ns))
        tracer = self.tracer
        request.trace = tracer.start(model.name, model.version, received_ns) if tracer is not None else None
        binding = None
        try:
            if request.uses_shared_memory:
                if self.shared_memory is None:
                    raise NotSupported("shared memory is not served by this server; send the tensors in the request")
                binding = await self.shared_memory.bind(request, local=local, reserve=reserve)
            stream = await model.open_stream(request, self.stream_limits, (reserve, release))
        except BaseException:
            if binding is not None:
                binding.close()
            if request.trace is not None:
                assert tracer is not None
                tracer.finish(request.trace)
            raise
        if request.trace is not None:
            trace = request.trace
            assert tracer is not None
            # Written once the stream has ended and the request has run (its COMPUTE_* marks are set when
            # run_requests returns, which may come after the final response).
            stream.on_close(lambda _: stream.ran.add_done_callback(lambda _: tracer.finish(trace)))
        if binding is not None:
            stream.set_writer(binding.write)  # each response's outputs go into the regions it named
            stream.on_close(lambda _: binding.close())
        return stream

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

    def _check_control(self, action: str) -> None:
        if self.control_mode != "explicit":
            raise InvalidInput(
                f"explicit model {action} is not allowed in model control mode {self.control_mode!r}; "
                "start the daemon with --model-control-mode explicit"
            )

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Triton's repository extension: load (or reload without downtime), optionally with the
        config given as JSON in ``parameters.config`` instead of config.pbtxt, and with the model's files
        in ``file:<version>/<name>`` parameters (a push: see core.pushed).

        A push is allowed in every model control mode (it adds to the repository, it does not replace
        the mode's choice of what the repository serves). A plain load of a model the repository has
        serves the repository's files again (as Triton does after a load with overrides) and forgets
        the pushed ones; of a model only pushed, it reloads the pushed files."""
        self.registry.model_dir(name)  # validates the name before anything touches the file system
        if any(key.startswith(FILE_PREFIX) for key in parameters):
            await self._push(name, parameters)
            return
        self._check_control("load")
        override = self._config(name, parameters)
        lock = self._push_locks.setdefault(name, asyncio.Lock())
        async with lock:
            pushed = self.pushes is not None and name in self.pushes.model_dirs()
            if pushed and self.registry.in_repository(name):
                await self.registry.load(name, override, source=self.registry.repository / name)
                assert self.pushes is not None
                await asyncio.to_thread(self.pushes.remove, name)
                return
            await self.registry.load(name, override)

    @staticmethod
    def _config(name: str, parameters: dict[str, Any]) -> Any:
        if "config" not in parameters:
            return None
        try:
            return config_from_json(parameters["config"], name)
        except ConfigError as exc:
            raise ConfigError(f"failed to load '{name}': {exc.message}") from None

    async def _push(self, name: str, parameters: dict[str, Any]) -> None:
        if self.pushes is None:
            raise NotSupported("this box keeps no pushed models (its state dir is not writable); put the files in "
                               "the repository, or make the state dir writable and restart the daemon")
        # Triton's words first ("failed to poll from model repository" is what Triton says of file
        # overrides it cannot use), then what is wrong; a 4xx over HTTP (the request is at fault, not the
        # box), and INTERNAL over gRPC as Triton answers (its gRPC model-control example checks that code).
        try:
            override, files = self._push_request(name, parameters)
        except (InvalidInput, PayloadTooLarge) as exc:
            refusal = type(exc)(f"failed to load '{name}', failed to poll from model repository: {exc.message}")
            refusal.grpc_code = "INTERNAL"
            raise refusal from None
        async with self._push_locks.setdefault(name, asyncio.Lock()):
            with self.registry.hold(name):
                await self._stage_and_load(self.pushes, name, override, files)

    def _push_request(self, name: str, parameters: dict[str, Any]) -> tuple[Any, dict[str, bytes]]:
        """The pushed config and files, checked (InvalidInput or PayloadTooLarge saying what is wrong)."""
        assert self.pushes is not None
        if "config" not in parameters:  # Triton's rule: the override directory's files come with a config
            raise InvalidInput("file overrides need the 'config' parameter (the model's configuration as JSON): the "
                               "pushed files replace the model's directory")
        override = self._config(name, parameters)
        files = file_parameters(parameters, self.pushes.limits.max_file_bytes)
        if not any("/" in relative and relative.split("/")[0].isdigit() for relative in files):
            raise InvalidInput("the pushed files have no version directory; send the model file as "
                               "'file:1/<file name>' (e.g. file:1/model.onnx)")
        return override, files

    async def _stage_and_load(self, store: PushStore, name: str, override: Any, files: dict[str, bytes]) -> None:
        staged = await asyncio.to_thread(store.stage, name, override, files)
        try:  # loaded beside the serving versions: requests switch over once it is ready
            await self.registry.load(name, None, source=staged.model_dir)
        except BaseException:
            await asyncio.to_thread(store.discard, staged)
            if not self.registry.in_repository(name) and name not in store.model_dirs():
                self.registry.forget(name)  # a failed first push leaves no entry behind
            raise
        replaced = await asyncio.to_thread(store.commit, staged)
        if replaced is not None:  # the versions it served are closed by now
            await asyncio.to_thread(store.remove_generation, replaced)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Triton's repository extension: unload; ``parameters.unload_dependents`` (a boolean) also unloads
        the composing models of an ensemble that no other loaded ensemble uses. A pushed model's files are
        removed (as Triton removes an override directory at unload)."""
        pushed = self.pushes is not None and name in self.pushes.model_dirs()
        if not pushed:
            self._check_control("unload")
        self.registry.model_dir(name)
        dependents = (parameters or {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput(f"parameter 'unload_dependents' must be a boolean, got {dependents!r}")
        async with self._push_locks.setdefault(name, asyncio.Lock()):
            await self.registry.unload(name, unload_dependents=dependents)
            if pushed:
                assert self.pushes is not None
                await asyncio.to_thread(self.pushes.remove, name)
                if not self.registry.in_repository(name):
                    self.registry.forget(name)
                elif self.control_mode != "explicit":  # these modes serve the whole repository
                    await self.registry.load(name, raise_errors=False)

    def _origin(self, name: str, loaded_from: str | None) -> str:
        if loaded_from is not None:
            return loaded_from
        return "pushed" if self.pushes is not None and name in self.pushes.model_dirs() else "repository"

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's index rows, each with the model's ``origin``: "repository", or "pushed" (its files came
        in a load request, see core.pushed)."""
        rows: list[dict[str, Any]] = []
        for entry in self.registry.entries():
            origin = self._origin(entry.name, entry.origin if entry.versions else None)
            if entry.state is not ModelState.READY:
                if not ready_only:
                    rows.append({"name": entry.name, "state": entry.state.value, "reason": entry.reason,
                                 "origin": origin})
                continue
            for version in sorted(entry.versions):
                rows.append({"name": entry.name, "version": str(version), "state": "READY", "reason": entry.reason,
                             "origin": origin})
            if not ready_only:
                for version, reason in sorted(entry.failures.items()):
                    rows.append({"name": entry.name, "version": str(version), "state": "UNAVAILABLE",
                                 "reason": reason, "origin": origin})
        return rows
