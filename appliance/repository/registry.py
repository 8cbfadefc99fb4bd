"""The model registry: what the repository holds, what is ready, and lookups for the request path."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import RuntimeOptions
from appliance.backends.base import BackendServices
from appliance.core.errors import (
    ApplianceError,
    ConfigError,
    InsufficientStorage,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NotInRepository,
)
from appliance.engine.model import ModelVersion
from appliance.engine.server_wide import ServerWide
from appliance.engine.streaming import StreamLimits
from appliance.repository.bls import LocalModels
from appliance.repository.config import read_config
from appliance.repository.ensemble import (
    EnsemblePlan,
    Step,
    check_composition,
    is_ensemble,
    load_ensemble,
    plan_ensemble,
)
from appliance.repository.ensemble.dependencies import find_cycle, users_of
from appliance.repository.events import ModelEvents
from appliance.repository.layout import directory_signature, model_directory, scan_models
from appliance.repository.loader import LoadedModel, load_model
from appliance.repository.memory import read_pressure
from appliance.repository.plan_choice import PlanChooser
from appliance.repository.residency import Residency, ResidencyRules

if TYPE_CHECKING:
    from appliance.repository.pushed import PushStore

__all__ = ["NOT_LOADED", "ModelEntry", "ModelRegistry", "ModelState", "parse_version"]

NOT_LOADED = "not loaded (model control mode explicit): POST /v2/repository/models/<name>/load"
_VERSION = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also takes '²'

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Chain:
    """How an ensemble's load treats a composing model that failed before."""

    retry_failed: bool = False
    """Load it again (the load API asked for the ensemble); at start-up its failure stands."""


class ModelState(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@dataclasses.dataclass(eq=False)
class ModelEntry:
    name: str
    state: ModelState = ModelState.LOADING
    reason: str = ""
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelVersion] = dataclasses.field(default_factory=dict)
    failures: dict[int, str] = dataclasses.field(default_factory=dict)
    signature: tuple | None = None
    """What the model directory looked like when it was loaded (poll mode compares it)."""
    wanted: bool = True
    """False for a model deliberately not loaded (explicit mode) or unloaded: not counted as a failure."""
    override: mc.ModelConfig | None = None
    """The config the load API gave the serving load (None: config.pbtxt); a retune reloads with it."""
    plan: EnsemblePlan | None = None
    """The steps of a loaded ensemble (None for any other model)."""
    waiting_for: str | None = None
    """The composing model whose unload took this ensemble down (poll mode loads it again with it)."""
    origin: str = "repository"
    """Where the serving files come from: "repository", or "pushed" (the load API's file overrides)."""
    retired_versions: tuple[int, ...] = ()
    """The versions it served before it was unloaded (Triton's index keeps a row for each)."""

    def latest(self) -> ModelVersion:
        if not self.versions:
            raise self.not_serving()
        return self.versions[max(self.versions)]

    def not_serving(self) -> ModelNotReady | ModelNotFound:
        """Why no version serves: still loading is worth a retry (503); unloaded or failed is Triton's
        NOT_FOUND "has no available versions", with the reason after its words."""
        why = self.reason or self.state.value
        if self.state is ModelState.LOADING:
            return ModelNotReady(f"model '{self.name}' is not ready: {why}", retry_after=1)
        return ModelNotFound(f"Request for unknown model: '{self.name}' has no available versions; {why}")


def parse_version(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not _VERSION.fullmatch(text):
        # Triton's words first (clients look for them), then the fix.
        raise InvalidInput(f"failed to get model version from specified version string {text[:40]!r} (details: "
                           "stol), version should be an integral value > 0; a model version is a positive integer "
                           "(or empty for the newest)")
    return int(text)


class ModelRegistry:
    def __init__(self, repository: Path, options: RuntimeOptions,
                 selector: asyncio.Future[PlanChooser | None] | None = None, retune: bool = False,
                 drain_timeout: float = 10.0,
                 on_event: Callable[[str, str, int | None, dict], None] | None = None,
                 overlay: Callable[[], Mapping[str, Path]] | None = None,
                 services: BackendServices | None = None, control_mode: str = "none",
                 pushes: PushStore | None = None, call_limits: StreamLimits | None = None,
                 server: ServerWide | None = None, residency: ResidencyRules | None = None) -> None:
        """``on_event`` is told of model_loaded / model_failed / backend_chosen / model_unloaded (kind,
        model, version, detail): the metrics history records them. ``overlay``: model name -> directory
        of the models pushed over the load API (appliance.repository.pushed), served in place of the repository's.
        ``services``: what the daemon lends backends; the registry adds its own models to it
        (``LocalModels``: Python models call models), which may load and unload models when
        ``control_mode`` is explicit, with files kept in ``pushes`` (as the load API's pushes are);
        ``call_limits`` bound those calls (their deadline, and the responses of a streamed one held for the
        calling model). ``server``: the response cache and rate limiter the models share. ``residency``: load
        on demand, idle unload, the memory budget and pressure (appliance.repository.residency), off by default."""
        self._server = server or ServerWide()
        self._overlay = overlay
        self.repository = repository
        self._drain_timeout = drain_timeout
        self._locks: dict[str, asyncio.Lock] = {}
        self._options = options
        self._selector = selector
        """Picks each model's plan once the hardware probe has run (a load waits for it); None, or a future
        that comes to None, serves each model with its config's backend as is."""
        self._events = ModelEvents(on_event)
        self._retune = retune
        self._models: dict[str, ModelEntry] = {}
        self._calls = LocalModels(self, explicit=control_mode == "explicit", pushes=pushes, limits=call_limits)
        self._services = dataclasses.replace(services or BackendServices(), models=self._calls)
        self._held: set[str] = set()
        """Models a push is replacing: re-scans and retunes leave them alone meanwhile."""
        self.residency = Residency(self, residency or ResidencyRules(), self._events, self._services.processes,
                                   read_pressure)

    def scan(self) -> list[Path]:
        """Model directories in the repository (hidden entries and plain files are skipped), pushed ones
        in place of the repository's."""
        return scan_models(self.repository, self._pushed())

    def _pushed(self) -> Mapping[str, Path]:
        return self._overlay() if self._overlay is not None else {}

    def pushed_names(self) -> list[str]:
        """Models served from the pushed overlay rather than the repository."""
        return sorted(self._overlay()) if self._overlay is not None else []

    def known(self, name: str) -> bool:
        """Whether the registry has an entry for ``name`` (loaded, loading, failed or unloaded)."""
        return name in self._models

    def in_repository(self, name: str) -> bool:
        """Whether the repository itself (not the pushed overlay) has a model directory ``name``."""
        path = self.repository / name
        return path.is_dir() and path.resolve().is_relative_to(self.repository.resolve())

    def discover(self) -> list[Path]:
        """Scan the repository and list its models as LOADING (blocking: call off the loop)."""
        paths = self.scan()
        for path in paths:
            self._models.setdefault(path.name, ModelEntry(path.name))
        return paths

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load every discovered model (or only ``names``), concurrently: a model with a cached plan is
        ready while another one is still measuring its candidates (the selector lets one model tune at
        a time). A model that fails is recorded UNAVAILABLE with its reason."""
        if not self._models:
            await asyncio.to_thread(self.discover)
        wanted = list(self._models) if names is None else [n for n in names if n in self._models]
        for name in set(self._models) - set(wanted):
            entry = self._models[name]
            entry.state, entry.reason, entry.wanted = ModelState.UNAVAILABLE, NOT_LOADED, False
        await self._load_in_order(wanted, force=False)

    async def _load_in_order(self, names: list[str], force: bool) -> None:
        """Load ``names`` concurrently, ensembles after the other models (an ensemble loads the models it
        needs itself, which would otherwise load twice). ``force``: reload models already ready."""
        ensembles = set(await asyncio.to_thread(self._ensembles_among, names))
        load = functools.partial(self.load, raise_errors=False) if force else self._load_if_needed
        await asyncio.gather(*(load(n) for n in names if n not in ensembles))
        await asyncio.gather(*(load(n) for n in names if n in ensembles))

    def _ensembles_among(self, names: list[str]) -> list[str]:
        return [name for name in names if self._plan_on_disk(name) is not None]

    def model_dir(self, name: str) -> Path:
        """The directory of model ``name``, which must lie inside the repository (no traversal, no
        symlink pointing out)."""
        return model_directory(self.repository, name, self._pushed())

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, config_override: mc.ModelConfig | None = None,
                   raise_errors: bool = True, traffic: dict[int, dict] | None = None,
                   source: Path | None = None) -> ModelEntry:
        """Load a model, or reload it without downtime: the new versions load beside the serving ones,
        requests switch to them once they are ready, and the old ones finish their requests before they
        close. A failed reload keeps the old versions serving and reports the failure. ``traffic``: per
        version, the traffic profile to tune it on (see retune). An ensemble first loads the composing
        models that are not ready (retrying those that failed). ``source``: the model directory to load
        from instead of the repository's (or overlay's), such as a push being staged."""
        path = self.model_dir(name)
        if source is not None:
            path = source
        async with self._lock(name):
            entry, retired = await self._load_locked(name, path, config_override, raise_errors, traffic,
                                                     _Chain(retry_failed=True))
        await self._retire(retired, "replaced by a new load")
        if entry.state is ModelState.READY:
            await self._recheck_users(name)
        return entry

    async def _load_if_needed(self, name: str, raise_errors: bool = False) -> ModelEntry:
        """Load ``name`` unless it is ready already (an ensemble loaded it as one of its steps)."""
        path = self.model_dir(name)
        async with self._lock(name):
            entry = self._models.get(name)
            if entry is not None and entry.state is ModelState.READY:
                return entry
            entry, _ = await self._load_locked(name, path, None, raise_errors, None, _Chain())
        return entry

    async def _load_locked(self, name: str, path: Path, config_override: mc.ModelConfig | None,
                           raise_errors: bool, traffic: dict[int, dict] | None,
                           chain: _Chain) -> tuple[ModelEntry, list[ModelVersion]]:
        """The load itself, under the model's lock; returns the entry and the versions it replaced."""
        self._calls.bind(asyncio.get_running_loop())
        if not path.is_dir():
            raise NotInRepository(f"failed to load '{name}', failed to poll from model repository; no such model "
                                  f"in the repository {self.repository}")
        entry = self._models.setdefault(name, ModelEntry(name))
        entry.wanted, entry.waiting_for = True, None
        if not entry.versions:
            entry.state, entry.reason = ModelState.LOADING, ""
        plan: EnsemblePlan | None = None
        try:
            config = config_override if config_override is not None else await asyncio.to_thread(read_config, path)
            if is_ensemble(config):
                plan = plan_ensemble(config)
                loaded = await self._load_ensemble(path, config, plan, chain)
            else:
                selector = await self._selector if self._selector is not None else None
                # A retune serves the same versions on another plan: their statistics count on (clients
                # such as perf_analyzer read them before and after a window). Any other load starts at 0.
                statistics = {n: v.stats for n, v in entry.versions.items()} if traffic is not None else None
                ticket = await self.residency.admit(name, path, config)
                try:
                    loaded = await asyncio.to_thread(
                        load_model, path, self._options, selector, self._retune, config_override, traffic,
                        self._services, self._server, statistics,
                    )
                except BaseException:
                    await self.residency.settle(ticket, ok=False)
                    raise
                await self.residency.settle(ticket, ok=True)
        except Exception as exc:
            message = exc.message if isinstance(exc, ApplianceError) else f"{type(exc).__name__}: {exc}"
            log.error("model %s failed to load: %s", name, message)
            self._events.emit("model_failed", name, None, {"reason": message})
            # The files that failed: a re-scan (poll mode, SIGHUP) tries again once they change.
            entry.signature = await asyncio.to_thread(_signature_or_none, path)
            if entry.versions:  # a failed reload: the old versions keep serving
                entry.reason = f"reload failed, still serving the previous load: {message}"
            else:
                entry.state, entry.reason = ModelState.UNAVAILABLE, message
            if raise_errors and isinstance(exc, InsufficientStorage):  # 507 as it is: no room, not a bad model
                raise
            if raise_errors:
                raise ConfigError(f"failed to load '{name}': {message}") from exc
            return entry, []
        for model in loaded.versions.values():
            model.start()
        retired = list(entry.versions.values())
        entry.config, entry.versions, entry.failures = loaded.config, loaded.versions, loaded.failures
        entry.override, entry.plan = config_override, plan
        entry.origin = "repository" if path == self.repository / name else "pushed"
        entry.state, entry.reason = ModelState.READY, ""
        entry.signature = await asyncio.to_thread(directory_signature, path)
        self._events.loaded(name, entry.versions, entry.failures)
        return entry, retired

    # -- ensembles ---------------------------------------------------------------------------

    async def _load_ensemble(self, path: Path, config: mc.ModelConfig, plan: EnsemblePlan,
                             chain: _Chain) -> LoadedModel:
        name = path.name
        plans = self._loaded_plans()
        cycle = await asyncio.to_thread(find_cycle, name, plan, lambda m: plans.get(m) or self._plan_on_disk(m))
        if cycle:
            raise ConfigError(f"circular dependency between ensembles: {' -> '.join(cycle)}; an ensemble cannot "
                              "contain itself, directly or through another ensemble")
        for model in sorted(plan.models()):
            await self._require(name, model, chain)
        configs = {step.number: self._step_config(name, step) for step in plan.steps}
        return await asyncio.to_thread(load_ensemble, path, config, plan, lambda step: configs[step.number],
                                       self._resolve, self._server.response_cache)

    def _plan_on_disk(self, name: str) -> EnsemblePlan | None:
        """The plan of a model not loaded yet, if it is an ensemble (blocking; None when unreadable: its
        own load reports why)."""
        try:
            config = read_config(self.model_dir(name))
            return plan_ensemble(config) if is_ensemble(config) else None
        except (ApplianceError, OSError):
            return None

    def composing(self) -> set[str]:
        """The models a loaded ensemble runs as its steps."""
        return {m for plan in self._loaded_plans().values() for m in plan.models()}

    def busy(self, name: str) -> bool:
        """Whether a load or unload of ``name`` is under way."""
        lock = self._locks.get(name)
        return lock is not None and lock.locked()

    def _loaded_plans(self) -> dict[str, EnsemblePlan]:
        return {e.name: e.plan for e in self._models.values() if e.plan is not None and e.versions}

    async def _require(self, ensemble: str, model: str, chain: _Chain) -> None:
        """Make sure composing model ``model`` is ready, loading it when it is not."""
        try:
            path = self.model_dir(model)
        except InvalidInput as exc:
            raise ConfigError(f"ensemble {ensemble} contains models that are not available or ambiguous: "
                              f"{model[:80]} ({exc.message})") from None
        if not path.is_dir():
            raise ConfigError(f"ensemble {ensemble} contains models that are not available or ambiguous: {model}; "
                              f"the repository {self.repository} has no model '{model}': add it or fix the step's "
                              "model_name")
        async with self._lock(model):
            entry = self._models.get(model)
            if entry is not None and entry.state is ModelState.READY:
                return
            if entry is not None and entry.wanted and entry.state is ModelState.UNAVAILABLE and not chain.retry_failed:
                raise ConfigError(f"ensemble '{ensemble}' depends on '{model}', which failed to load: {entry.reason}")
            entry, _ = await self._load_locked(model, path, None, False, None, chain)
        if entry.state is not ModelState.READY:
            raise ConfigError(f"ensemble '{ensemble}' depends on '{model}', which failed to load: {entry.reason}")

    def _step_config(self, ensemble: str, step: Step) -> mc.ModelConfig:
        """The config of the version a step runs (ConfigError when it is not loaded)."""
        entry = self._models.get(step.model)
        versions = entry.versions if entry is not None else {}
        if step.version is None:
            if not versions:
                raise ConfigError(f"ensemble '{ensemble}' depends on '{step.model}', which is not loaded")
            return versions[max(versions)].config
        if step.version not in versions:
            raise ConfigError(
                f"ensemble '{ensemble}' depends on '{step.model}' whose required version {step.version} is not "
                f"loaded (loaded: {sorted(versions) or 'none'}); set model_version in {step.label} to -1 (the "
                "newest) or to a loaded version, or widen the model's version_policy"
            )
        return versions[step.version].config

    def _resolve(self, name: str, version: int | None) -> ModelVersion:
        """The ready version an ensemble step runs, looked up at each request."""
        entry = self.entry(name)
        if version is None:
            return entry.latest()
        model = entry.versions.get(version)
        if model is None:
            why = entry.failures.get(version) or entry.reason or "not loaded"
            raise ModelNotReady(f"model '{name}' version {version} is not ready: {why}")
        return model

    async def _recheck_users(self, name: str) -> None:
        """After ``name`` (re)loaded: an ensemble using it that no longer fits its config goes down."""
        for user in users_of(name, self._loaded_plans()):
            entry = self._models[user]
            assert entry.plan is not None and entry.config is not None
            try:
                flow = check_composition(entry.plan, entry.config, functools.partial(self._step_config, user))
                if flow.is_decoupled != entry.config.model_transaction_policy.decoupled:
                    now = "would now be" if flow.is_decoupled else "would no longer be"
                    raise ConfigError(f"the ensemble {now} decoupled (its clients stream differently)")
            except ConfigError as exc:
                await self.unload(user, f"composing model '{name}' was reloaded with a config this ensemble no "
                                        f"longer fits: {exc.message}; fix one of them and load '{user}' again")
                entry.wanted = True  # a failure, not a deliberate unload

    async def retune(self, name: str, traffic: dict[int, dict]) -> ModelEntry:
        """Reload a model with its versions tuned on their traffic (``traffic``: per version, the profile
        from appliance.engine.traffic), through ``load``: no downtime, and a failed retune keeps the model serving.
        The versions' statistics count on across the switch (the user reloaded nothing)."""
        entry = self.entry(name)
        if name in self._held:
            return entry
        return await self.load(name, entry.override, raise_errors=False, traffic=traffic)

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """While a push loads ``name`` from its staging directory and then makes it the overlay, a
        re-scan (poll mode) or a retune would reload it from where it served before: they skip it."""
        self._held.add(name)
        try:
            yield
        finally:
            self._held.discard(name)

    async def unload(self, name: str, reason: str = "unloaded", unload_dependents: bool = False) -> None:
        """Stop routing requests to the model, let its requests finish, then free it. Ensembles using it
        are unloaded first (they cannot serve without it); ``unload_dependents`` (Triton's parameter) also
        unloads an ensemble's composing models that no other loaded ensemble uses."""
        self.entry(name)
        for user in users_of(name, self._loaded_plans()):
            await self.unload(user, f"unloaded: its composing model '{name}' was unloaded ({reason}); load "
                                    f"'{name}' and then '{user}' again")
            self._models[user].waiting_for = name
        async with self._lock(name):
            entry = self.entry(name)
            plan, retired = entry.plan, list(entry.versions.values())
            entry.retired_versions = tuple(sorted(entry.versions)) or entry.retired_versions
            entry.versions, entry.failures, entry.plan = {}, {}, None
            entry.state, entry.reason, entry.wanted = ModelState.UNAVAILABLE, reason, False
        await self._retire(retired, reason)
        if unload_dependents and plan is not None:
            still_used = {m for p in self._loaded_plans().values() for m in p.models()}
            for model in sorted(plan.models() - still_used):
                composing = self._models.get(model)
                if composing is not None and composing.versions:
                    await self.unload(model, f"unloaded with ensemble '{name}' (unload_dependents)", True)

    async def _retire(self, models: list[ModelVersion], reason: str) -> None:
        for model in models:
            await model.drain(self._drain_timeout)
            for error in await model.close():
                log.error("error while closing %s version %d: %s", model.name, model.version, error)
            self._events.emit("model_unloaded", model.name, model.version, {"reason": reason})

    async def rescan(self) -> dict[str, list[str]]:
        """Apply the repository's changes: load new models, reload changed ones (without downtime),
        unload removed ones. Models that did not change keep serving untouched."""
        paths = {p.name: p for p in await asyncio.to_thread(self.scan)}
        added = sorted(n for n in paths if n not in self._models)
        removed = sorted(n for n in self._models if n not in paths)
        changed = []
        for name, entry in list(self._models.items()):
            # Loaded models, and models whose last load failed (their files fixed since: Triton never
            # retries those, server#6534); a model unloaded on purpose stays unloaded.
            tried = entry.versions or (entry.wanted and entry.state is ModelState.UNAVAILABLE)
            if (name in paths and name not in self._held and tried and entry.signature is not None
                    and await asyncio.to_thread(directory_signature, paths[name]) != entry.signature):
                changed.append(name)
        for name in added:
            self._models[name] = ModelEntry(name)
        back = set(added) | set(changed)
        revived = sorted(n for n, e in self._models.items() if e.waiting_for in back and n in paths)
        await self._load_in_order([*added, *changed, *(n for n in revived if n not in back)], force=True)
        for name in removed:
            await self.unload(name, "removed from the repository")
            self._models.pop(name, None)
        return {"added": added, "removed": removed, "reloaded": sorted(changed)}

    def forget(self, name: str) -> None:
        """Drop a model that is not loaded and has no directory left (a pushed model, unloaded)."""
        entry = self._models.get(name)
        if entry is not None and not entry.versions:
            self._models.pop(name, None)

    def ready_versions(self) -> list[ModelVersion]:
        return [m for e in self._models.values() for _, m in sorted(e.versions.items())]

    def entries(self) -> list[ModelEntry]:
        return [self._models[name] for name in sorted(self._models)]

    def entry(self, name: str) -> ModelEntry:
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{name[:255]}' is not found")
        return entry

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The ready model version a request names (the newest ready one when no version is given)."""
        entry = self._models.get(name) or self.entry(name)
        if not version:
            return entry.latest()
        number = parse_version(version)
        if number is None:
            return entry.latest()
        model = entry.versions.get(number)
        if model is None:
            if number in entry.failures:  # Triton's words: a version that failed is not there
                raise ModelNotFound(f"Request for unknown model: '{name}' version {number} is not found; it failed "
                                    f"to load: {entry.failures[number]}")
            raise ModelNotFound(
                f"Request for unknown model: '{name}' version {number} is not found; "
                f"available versions: {sorted(entry.versions) or 'none'}"
            )
        return model

    @property
    def all_ready(self) -> bool:
        return all(e.state is ModelState.READY and not e.failures for e in self._models.values() if e.wanted)

    def ready_names(self) -> list[str]:
        return sorted(name for name, e in self._models.items() if e.state is ModelState.READY)

    def ready_count(self) -> int:
        return sum(1 for e in self._models.values() if e.state is ModelState.READY)

    async def close(self, timeout: float) -> list[BaseException]:
        """Let in-flight requests finish, then free every instance, all within ``timeout``; an instance
        still busy then is left running (reported in the errors) rather than waited for."""
        deadline = time.monotonic() + timeout
        models = self.ready_versions()
        await asyncio.gather(*(m.drain(timeout) for m in models))
        errors: list[BaseException] = []
        for model in models:
            errors.extend(await model.close(max(0.0, deadline - time.monotonic())))
            self._events.emit("model_unloaded", model.name, model.version, {})
        for entry in self._models.values():
            entry.versions.clear()
            entry.plan = None
            entry.state, entry.reason = ModelState.UNAVAILABLE, "server is shutting down"
        return errors


def _signature_or_none(path: Path) -> tuple | None:
    """``directory_signature``, or None when the directory cannot be read (blocking)."""
    try:
        return directory_signature(path)
    except OSError:
        return None
