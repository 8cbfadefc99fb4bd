"""Which models are resident: loaded on their first request, unloaded when idle, under a memory budget,
and given back when the kernel reports memory pressure.

The registry asks ``admit`` before each load (the estimate, the budget, the evictions it takes) and
``settle`` after it (the measurement); the data plane asks ``demand`` when a request names a model the
repository has but that is not loaded; ``run`` is the watcher (idle models, pressure, the per-model
measurement /metrics shows). Every load and unload it causes is counted and recorded with its cause:
demand, idle, budget or pressure (loads it did not cause are "start", before start-up ended, or
"explicit": the load API, a re-scan, an ensemble's step). ``residence`` says it of one model (the
repository index's rows), ``status`` of them all (GET /v2/memory, /metrics, the dashboard).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ApplianceError, InsufficientStorage, ModelNotFound, Unavailable
from appliance.repository.memory import (
    MIB,
    Estimate,
    MemoryBook,
    Pressure,
    declared,
    estimate_from_files,
    process_rss,
)

if TYPE_CHECKING:
    from appliance.backends.children import ChildProcesses
    from appliance.engine.model import ModelVersion
    from appliance.repository.events import ModelEvents

__all__ = ["Causes", "Residence", "Residency", "ResidencyRules"]

log = logging.getLogger(__name__)

RETRY_FAILED_SECS = 10.0
"""A model whose load on demand failed is not loaded again on demand for this long (its requests get
the failure), so that a broken model is not reloaded by every request."""


class Causes:
    DEMAND = "demand"
    IDLE = "idle"
    BUDGET = "budget"
    PRESSURE = "pressure"
    EXPLICIT = "explicit"
    START = "start"


class ModelEntry(Protocol):
    """What residency reads and sets of a registry's entry (``appliance.repository.registry.ModelEntry``)."""

    name: str
    versions: dict[int, ModelVersion]
    config: mc.ModelConfig | None
    reason: str
    wanted: bool
    state: Any


class ModelRegistry(Protocol):
    """The registry as residency uses it (``appliance.repository.registry.ModelRegistry``, which owns the
    residency: a protocol, not an import, keeps the two modules free of a cycle)."""

    def entries(self) -> list[Any]: ...

    def entry(self, name: str) -> Any: ...

    async def load(self, name: str) -> Any: ...

    async def unload(self, name: str, reason: str = ...) -> None: ...

    def model_dir(self, name: str) -> Path: ...

    def in_repository(self, name: str) -> bool: ...

    def composing(self) -> set[str]: ...

    def busy(self, name: str) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ResidencyRules:
    """The models section's residency settings."""

    load_on_demand: bool = False
    load_timeout: float = 120.0
    """Seconds a request waits for the load on demand of its model."""
    idle_unload_secs: float = 0.0
    """0: never unload for idleness (a model's config parameter idle_unload_secs may still say so)."""
    budget_bytes: int | None = None
    pressure_threshold: float = 0.0
    """PSI ``some avg10`` (percent) at or above which idle models are unloaded; 0: not watched."""
    book: Path | None = None
    """Where measurements are kept across restarts (None: in memory)."""
    check_interval: float = 0.5

    @property
    def active(self) -> bool:
        return (self.load_on_demand or self.idle_unload_secs > 0 or self.budget_bytes is not None
                or self.pressure_threshold > 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Residence:
    """Why one model is loaded or not, and what it holds (a repository index row carries it)."""

    load_cause: str | None = None
    """For a loaded model: "demand", "start" or "explicit" (None: residency measured no load of it)."""
    unload_cause: str | None = None
    """For a model residency unloaded and that is not loaded again: "idle", "budget" or "pressure"."""
    pinned: bool = False
    memory_bytes: int | None = None
    """What a loaded model holds, as last measured (None: not loaded, or not measured)."""


@dataclasses.dataclass(slots=True)
class Ticket:
    """One admitted load: what it was estimated at, the daemon's RSS before it, when it started."""

    name: str
    estimate: Estimate
    floor: int
    """The config's memory_mib (0 without): what the model holds is never counted below it."""
    daemon_rss: int
    started: float


class Residency:
    def __init__(self, registry: ModelRegistry, rules: ResidencyRules, events: ModelEvents,
                 processes: ChildProcesses | None = None,
                 pressure: Callable[[], Pressure] | None = None) -> None:
        """``processes``: the model processes, by model (their RSS is what a Python model holds);
        ``pressure``: reads the kernel's memory pressure (blocking; injected by tests)."""
        self._registry = registry
        self.rules = rules
        self._events = events
        self._processes = processes
        self._pressure = pressure
        self._book = MemoryBook(rules.book) if rules.active else MemoryBook(None)
        self._pid = os.getpid()
        self._flights: dict[str, asyncio.Future[None]] = {}
        self._failed_at: dict[str, float] = {}
        self._pinned: set[str] = set()
        self._causes: dict[str, str] = {}
        """The cause of a load under way (absent: explicit)."""
        self._reserved: dict[str, int] = {}
        self._evicting: set[str] = set()
        self._growth: dict[str, int] = {}
        self._floor: dict[str, int] = {}
        self._held: dict[str, int] = {}
        """What each loaded model holds, in bytes, as last measured (growth at load + its processes' RSS)."""
        self._loaded_ms: dict[str, int] = {}
        self._load_cause: dict[str, str] = {}
        """The cause of each model's last load."""
        self._unload_cause: dict[str, str] = {}
        """The cause of each model's last unload by residency, until it loads again."""
        self._starting = True
        """Until start-up's loads end (``mark_not_loaded``): the loads settled meanwhile are "start" ones."""
        self._last_high: int | None = None
        self.loads: collections.Counter[tuple[str, str]] = collections.Counter()
        """(model, cause) -> loads."""
        self.unloads: collections.Counter[tuple[str, str]] = collections.Counter()
        self.first_request_seconds: dict[str, float] = {}
        """The last load on demand of each model: seconds from its first request to ready."""

    @property
    def active(self) -> bool:
        return self.rules.active

    # -- pinning -------------------------------------------------------------------------------

    def pin(self, names: Iterable[str]) -> None:
        """Never unload these for idleness, the budget or pressure (--load-model, the load API's
        ``pinned: true``)."""
        self._pinned.update(names)

    def pinned(self, name: str) -> bool:
        if name in self._pinned:
            return True
        entry = self._entry(name)
        return entry is not None and _parameter(entry.config, "pinned").lower() == "true"

    # -- load on demand ------------------------------------------------------------------------

    def on_demand(self, name: str) -> bool:
        """Whether a request for ``name``, which is not served now, should load it and wait."""
        if not self.rules.load_on_demand:
            return False
        if name in self._flights:
            return True
        entry = self._entry(name)
        if entry is not None and (entry.versions or entry.state.value == "LOADING"):
            return False  # the version asked is not there, or a load it did not start is under way
        failed = self._failed_at.get(name)
        if failed is not None and time.monotonic() - failed < RETRY_FAILED_SECS:
            return False
        if entry is not None:
            return True
        try:
            self._registry.model_dir(name)
        except ApplianceError:
            return False
        return self._registry.in_repository(name)

    async def demand(self, name: str, timeout: float | None = None) -> None:
        """Load ``name`` for a request and wait for it: one load however many requests wait, each waiting
        up to load_on_demand_timeout, or its own ``timeout`` (seconds) where that is shorter; the load's
        failure reaches every one of them. A waiter that gives up leaves the load running for the others."""
        flight = self._flights.get(name)
        if flight is None:
            flight = asyncio.ensure_future(self._load_on_demand(name))
            self._flights[name] = flight
            flight.add_done_callback(lambda done: self._landed(name, done))
        limit = self.rules.load_timeout
        own = timeout is not None and timeout < limit
        try:
            await asyncio.wait_for(asyncio.shield(flight), timeout if own else limit)
        except TimeoutError:
            if own:
                raise Unavailable(f"model '{name}' is still loading on demand after the request's timeout "
                                  f"({timeout:g} s, its 'timeout' parameter); retry shortly with a longer "
                                  "timeout, or load it at start with --load-model", retry_after=5) from None
            raise Unavailable(f"model '{name}' is still loading on demand after {limit:g} s "
                              "(load_on_demand_timeout); retry shortly, or load it at start with --load-model",
                              retry_after=5) from None

    def _landed(self, name: str, flight: asyncio.Future[None]) -> None:
        self._flights.pop(name, None)
        if not flight.cancelled() and flight.exception() is not None:  # retrieved: waiters may have left
            self._failed_at[name] = time.monotonic()

    async def _load_on_demand(self, name: str) -> None:
        started = time.monotonic()
        self._causes[name] = Causes.DEMAND
        log.info("model %s: loading on its first request (load_on_demand)", name)
        try:
            entry = await self._registry.load(name)
        except InsufficientStorage:
            entry = self._registry.entry(name)
            if not entry.versions:  # refused for room, not broken: readiness does not count it
                entry.wanted = False
            raise
        finally:
            self._causes.pop(name, None)
        self._failed_at.pop(name, None)
        entry.reason = "loaded on its first request (load_on_demand)"
        self.first_request_seconds[name] = time.monotonic() - started

    def mark_not_loaded(self) -> None:
        """After start-up: models not loaded say that their first request loads them; loads from now on
        are no longer "start" ones."""
        self._starting = False
        if not self.rules.load_on_demand:
            return
        for entry in self._registry.entries():
            if not entry.versions and not entry.wanted:
                entry.reason = "not loaded: loads on its first request (load_on_demand)"

    # -- the budget ----------------------------------------------------------------------------

    async def admit(self, name: str, path: Path, config: mc.ModelConfig) -> Ticket | None:
        """Before a load of ``name`` (under its lock): its estimate, room made under the budget by unloading
        the least recently used idle models; InsufficientStorage when it cannot fit, even alone."""
        if not self.active:
            return None
        estimate = await asyncio.to_thread(self._estimate, name, path, config)
        budget = self.rules.budget_bytes
        if budget is not None:
            if estimate.bytes > budget and estimate.known is not None and estimate.known <= budget:
                # Only the backend's base, a guess, does not fit: load it alone rather than refuse on a guess
                # (its measurement then tells the truth for the next load).
                estimate = dataclasses.replace(estimate, bytes=budget)
            if estimate.bytes > budget:
                raise InsufficientStorage(
                    f"model '{name}' needs about {_mib(estimate.bytes)} MiB ({estimate.source}) but the model memory "
                    f"budget is {_mib(budget)} MiB (model_memory_budget_mib): raise the budget, or serve a smaller "
                    "model")
            await self._make_room(name, estimate.bytes, budget)
        self._reserved[name] = estimate.bytes
        rss = await asyncio.to_thread(process_rss, (self._pid,))
        return Ticket(name, estimate, declared(name, config) or 0, rss, time.monotonic())

    def _estimate(self, name: str, path: Path, config: mc.ModelConfig) -> Estimate:
        measured = self._book.get(name)
        floor = declared(name, config) or 0
        if measured is not None and measured >= floor:
            return Estimate(measured, "measured at its last load")
        return estimate_from_files(path, config)

    def used(self, excluding: str = "") -> int:
        """Bytes the loaded models hold and the loads under way reserve (a model being unloaded counts
        until its processes have ended)."""
        held = sum(size for name, size in self._held.items()
                   if name != excluding and (name in self._evicting or self._has_versions(name)))
        return held + sum(size for name, size in self._reserved.items() if name != excluding)

    async def _make_room(self, name: str, size: int, budget: int) -> None:
        deadline = time.monotonic() + self.rules.load_timeout
        while True:
            need = self.used(excluding=name) + size - budget
            if need <= 0:
                return
            victims, freed = [], 0
            for candidate in self._idle_first(exclude=name):
                victims.append(candidate)
                freed += self._held.get(candidate, 0)
                if freed >= need:
                    break
            if freed >= need:
                self._reserved[name] = size  # ours before the unloads yield: a load beside this one sees it
                again = "; loads again on its next request (load_on_demand)" if self.rules.load_on_demand else ""
                for victim in victims:
                    await self._unload(victim, Causes.BUDGET,
                                       f"unloaded to make room for '{name}' under the model memory budget "
                                       f"({_mib(budget)} MiB, model_memory_budget_mib){again}")
                continue
            if time.monotonic() >= deadline:
                busy = sorted(n for n in self._held if self._has_versions(n) and n != name)
                raise InsufficientStorage(
                    f"model '{name}' needs about {_mib(size)} MiB but only {_mib(max(0, budget - self.used(name)))} "
                    f"MiB of the model memory budget ({_mib(budget)} MiB, model_memory_budget_mib) is free, and the "
                    f"models holding the rest are busy or pinned ({', '.join(busy) or 'loads under way'}); retry "
                    "later, unload one, or raise the budget")
            await asyncio.sleep(0.05)  # a busy model may go idle; a load under way may end

    async def settle(self, ticket: Ticket | None, ok: bool) -> None:
        """After the load ``ticket`` admitted: measure what it holds (kept for its next load's estimate)."""
        if ticket is None:
            return
        name = ticket.name
        try:
            if not ok:
                return
            daemon = await asyncio.to_thread(process_rss, (self._pid,))
            children = await asyncio.to_thread(process_rss, self._pids(name))
            self._growth[name] = max(0, daemon - ticket.daemon_rss)
            self._floor[name] = ticket.floor
            self._held[name] = max(ticket.floor, self._growth[name] + children)
            self._loaded_ms[name] = time.time_ns() // 1_000_000
            await asyncio.to_thread(self._book.record, name, self._held[name])
            cause = self._causes.get(name, Causes.START if self._starting else Causes.EXPLICIT)
            self._load_cause[name] = cause
            self._unload_cause.pop(name, None)
            seconds = time.monotonic() - ticket.started
            self.loads[(name, cause)] += 1
            self._events.emit("model_residency", name, None, {
                "action": "load", "cause": cause, "seconds": round(seconds, 3), "bytes": self._held[name],
                "estimate": ticket.estimate.bytes, "estimate_source": ticket.estimate.source})
            log.info("model %s holds %d MiB (estimated %d MiB, %s); loaded in %.2f s (%s)", name,
                     _mib(self._held[name]), _mib(ticket.estimate.bytes), ticket.estimate.source, seconds, cause)
        finally:
            self._reserved.pop(name, None)

    def _pids(self, name: str) -> set[int]:
        return self._processes.pids_of(name) if self._processes is not None else set()

    # -- idle, pressure, measurement -----------------------------------------------------------

    async def run(self) -> None:
        """The watcher: every check_interval, unload what sat idle too long and, under memory pressure,
        the least recently used idle model; refresh what each model holds."""
        while True:
            await asyncio.sleep(self.rules.check_interval)
            try:
                await self.tick()
            except Exception:
                log.exception("the residency watcher's check failed")

    async def tick(self) -> None:
        await self.unload_idle()
        await self.relieve_pressure()
        await self.refresh()

    async def unload_idle(self) -> list[str]:
        """Unload every model idle past its idle_unload_secs; the names unloaded."""
        now_ms = time.time_ns() // 1_000_000
        unloaded = []
        for name in self._idle_first():
            entry = self._registry.entry(name)
            limit = self._idle_limit(entry)
            idle = (now_ms - self._last_used_ms(entry)) / 1000
            if limit > 0 and idle >= limit:
                again = "; loads again on its next request (load_on_demand)" if self.rules.load_on_demand else ""
                await self._unload(name, Causes.IDLE, f"unloaded: no request for {idle:.0f} s "
                                                      f"(idle_unload_secs {limit:g}){again}")
                unloaded.append(name)
        return unloaded

    async def relieve_pressure(self) -> str | None:
        """Under memory pressure, unload the least recently used idle model; its name."""
        if self.rules.pressure_threshold <= 0 or self._pressure is None:
            return None
        reading = await asyncio.to_thread(self._pressure)
        high, self._last_high = self._last_high, reading.high_events
        why = None
        if reading.some_avg10 is not None and reading.some_avg10 >= self.rules.pressure_threshold:
            why = (f"PSI some avg10={reading.some_avg10:g}% >= memory_pressure_threshold "
                   f"{self.rules.pressure_threshold:g}%")
        elif high is not None and reading.high_events is not None and reading.high_events > high:
            why = f"the cgroup went over memory.high {reading.high_events - high} times"
        if why is None:
            return None
        victim = next(iter(self._idle_first()), None)
        if victim is None:
            log.warning("memory pressure (%s), and no idle model to unload", why)
            return None
        log.warning("memory pressure (%s): unloading idle model %s, the least recently used", why, victim)
        await self._unload(victim, Causes.PRESSURE, f"unloaded under memory pressure ({why})")
        return victim

    async def refresh(self) -> None:
        """Measure again what each loaded model holds (its processes' RSS changes as it serves)."""
        if not self.active:
            return
        names = [n for n in self._held if self._has_versions(n)]
        sizes = await asyncio.to_thread(lambda: {n: process_rss(self._pids(n)) for n in names})
        for name, children in sizes.items():
            if name in self._held:
                self._held[name] = max(self._floor.get(name, 0), self._growth.get(name, 0) + children)

    def memory(self) -> dict[str, int]:
        """Bytes each loaded model holds, as last measured (for /metrics and the dashboard)."""
        return {n: size for n, size in sorted(self._held.items()) if self._has_versions(n)}

    def residence(self, name: str) -> Residence:
        """Why ``name`` is loaded (its last load's cause) or not (residency's unload), whether it is
        pinned, what it holds; all None while residency is off."""
        if not self.active:
            return Residence()
        loaded = self._has_versions(name)
        return Residence(self._load_cause.get(name) if loaded else None,
                         None if loaded else self._unload_cause.get(name), self.pinned(name),
                         self._held.get(name) if loaded else None)

    def status(self) -> dict[str, object]:
        """Every figure at once (JSON): the rules in force, the budget and what is used of it, what each
        loaded model holds and why it is loaded, the loads and unloads by cause, first-request seconds."""
        rules = self.rules
        return {"active": self.active, "load_on_demand": rules.load_on_demand,
                "load_on_demand_timeout": rules.load_timeout, "idle_unload_secs": rules.idle_unload_secs,
                "memory_pressure_threshold": rules.pressure_threshold,
                "budget_bytes": rules.budget_bytes, "used_bytes": self.used(), "models": self.memory(),
                "load_causes": {n: self._load_cause[n] for n in self.memory() if n in self._load_cause},
                "unload_causes": {n: c for n, c in sorted(self._unload_cause.items()) if not self._has_versions(n)},
                "pinned": sorted(self._pinned),
                "loads": [{"model": m, "cause": c, "count": n} for (m, c), n in sorted(self.loads.items())],
                "unloads": [{"model": m, "cause": c, "count": n} for (m, c), n in sorted(self.unloads.items())],
                "first_request_seconds": dict(sorted(self.first_request_seconds.items()))}

    # -- helpers -------------------------------------------------------------------------------

    async def _unload(self, name: str, cause: str, reason: str) -> None:
        self._evicting.add(name)
        try:
            log.info("model %s: %s", name, reason)
            await self._registry.unload(name, reason)
        except ModelNotFound:
            return
        finally:
            self._evicting.discard(name)
        self.unloads[(name, cause)] += 1
        self._unload_cause[name] = cause
        self._events.emit("model_residency", name, None, {"action": "unload", "cause": cause, "reason": reason,
                                                          "bytes": self._held.get(name, 0)})

    def _idle_first(self, exclude: str = "") -> list[str]:
        """Loaded models that may be unloaded now, least recently used first: not pinned, no request in
        flight or queued, no live sequence, not a step of a loaded ensemble, no load or unload under way."""
        composing = self._registry.composing()
        candidates = []
        for entry in self._registry.entries():
            name = entry.name
            if (name == exclude or not entry.versions or name in composing or name in self._evicting
                    or name in self._flights or name in self._reserved or self._registry.busy(name)
                    or self.pinned(name) or _in_use(entry)):
                continue
            candidates.append((self._last_used_ms(entry), name))
        return [name for _, name in sorted(candidates)]

    def _idle_limit(self, entry: ModelEntry) -> float:
        given = _parameter(entry.config, "idle_unload_secs")
        if given:
            try:
                return max(0.0, float(given))
            except ValueError:
                log.warning("model %s: parameter idle_unload_secs %r is not a number of seconds; using %g",
                            entry.name, given[:40], self.rules.idle_unload_secs)
        return self.rules.idle_unload_secs

    def _last_used_ms(self, entry: ModelEntry) -> int:
        used = [v.stats.last_inference_ms for v in entry.versions.values()]
        return max([*used, self._loaded_ms.get(entry.name, 0)])

    def _entry(self, name: str) -> ModelEntry | None:
        try:
            return self._registry.entry(name)
        except ModelNotFound:
            return None

    def _has_versions(self, name: str) -> bool:
        entry = self._entry(name)
        return entry is not None and bool(entry.versions)


def _in_use(entry: ModelEntry) -> bool:
    for version in entry.versions.values():
        sequences = version.stats.sequences
        if version.users or version.scheduler.pending or (
                sequences is not None and sequences.active + sequences.backlog > 0):
            return True
    return False


def _parameter(config: mc.ModelConfig | None, key: str) -> str:
    if config is None or key not in config.parameters:
        return ""
    return config.parameters[key].string_value.strip()


def _mib(size: int) -> int:
    return -(-size // MIB)
