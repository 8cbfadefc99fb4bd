"""Triton's model repository extension through the data plane: the index, load (with a config override,
or with the model's files: a push) and unload, in every model control mode's rules."""

from __future__ import annotations

import asyncio
from typing import Any

from appliance.core.errors import InvalidInput, NotSupported, Unavailable
from appliance.protocol.results import IndexEntry
from appliance.repository.push_load import checked_push, config_override, load_push
from appliance.repository.pushed import FILE_PREFIX, PushStore
from appliance.repository.registry import ModelRegistry, ModelState

__all__ = ["RepositoryControl"]


class RepositoryControl:
    def __init__(self, registry: ModelRegistry, *, control_mode: str = "none", pushes: PushStore | None = None) -> None:
        """``pushes``: where models pushed over the load API's file overrides are kept; None refuses file
        overrides."""
        self._registry = registry
        self._control_mode = control_mode
        self._pushes = pushes
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _check_control(self, action: str) -> None:
        if self._control_mode != "explicit":
            # Triton's words and status (UNAVAILABLE), then the fix.
            raise Unavailable(
                "explicit model load / unload is not allowed if polling is enabled; this server's model control "
                f"mode is {self._control_mode!r}: start it with --model-control-mode explicit"
            )

    def _pushed(self, name: str) -> bool:
        return self._pushes is not None and name in self._pushes.model_dirs()

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        """Load (or reload without downtime), optionally with the config given as JSON in
        ``parameters.config`` instead of config.pbtxt, and with the model's files in
        ``file:<version>/<name>`` parameters (a push: see appliance.repository.pushed).

        A push is allowed in every model control mode (it adds to the repository, it does not replace
        the mode's choice of what the repository serves). A plain load of a model the repository has
        serves the repository's files again (as Triton does after a load with overrides) and forgets
        the pushed ones; of a model only pushed, it reloads the pushed files."""
        self._registry.model_dir(name)  # validates the name before anything touches the file system
        if any(key.startswith(FILE_PREFIX) for key in parameters):
            await self._push(name, parameters)
            return
        self._check_control("load")
        override = config_override(name, parameters)
        pinned = parameters.get("pinned", False)
        if not isinstance(pinned, bool):
            raise InvalidInput(f"parameter 'pinned' must be a boolean, got {str(pinned)[:40]!r}")
        if pinned:  # never unloaded for idleness, the memory budget or pressure (docs/memory.md)
            self._registry.residency.pin((name,))
        async with self._lock(name):
            if self._pushed(name) and self._registry.in_repository(name):
                await self._registry.load(name, override, source=self._registry.repository / name)
                assert self._pushes is not None
                await asyncio.to_thread(self._pushes.remove, name)
                return
            await self._registry.load(name, override)

    async def _push(self, name: str, parameters: dict[str, Any]) -> None:
        if self._pushes is None:
            raise NotSupported("this box keeps no pushed models (its state dir is not writable); put the files in "
                               "the repository, or make the state dir writable and restart the daemon")
        override, files = checked_push(self._pushes, name, parameters)
        async with self._lock(name):
            await load_push(self._registry, self._pushes, name, override, files)

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        """Unload; ``parameters.unload_dependents`` (a boolean) also unloads the composing models of an
        ensemble that no other loaded ensemble uses. A pushed model's files are removed (as Triton removes
        an override directory at unload)."""
        pushed = self._pushed(name)
        if not pushed:
            self._check_control("unload")
        self._registry.model_dir(name)
        if not self._registry.known(name):
            return  # as Triton: unloading a model that is not there succeeds (idempotent unload scripts)
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput(f"parameter 'unload_dependents' must be a boolean, got {dependents!r}")
        async with self._lock(name):
            await self._registry.unload(name, unload_dependents=dependents)
            if pushed:
                assert self._pushes is not None
                await asyncio.to_thread(self._pushes.remove, name)
                if not self._registry.in_repository(name):
                    self._registry.forget(name)
                elif self._control_mode != "explicit":  # these modes serve the whole repository
                    await self._registry.load(name, raise_errors=False)

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Triton's index rows: a READY model's versions one row each, any other model one row (and its
        versions that failed to load, unless ``ready_only``)."""
        rows: list[IndexEntry] = []
        for entry in self._registry.entries():
            if entry.versions and entry.origin is not None:
                origin = entry.origin
            else:
                origin = "pushed" if self._pushed(entry.name) else "repository"
            residence = self._registry.residency.residence(entry.name)
            if entry.state is not ModelState.READY:
                if ready_only:
                    continue
                # An unloaded model keeps a row per version it served (Triton's index does).
                versions: list[str | None] = (
                    [str(v) for v in entry.retired_versions] if entry.state is ModelState.UNAVAILABLE else [])
                rows.extend(IndexEntry(entry.name, entry.state.value, entry.reason, origin, version,
                                       unload_cause=residence.unload_cause, pinned=residence.pinned)
                            for version in versions or [None])
                continue
            # What a model holds is measured for the model, not per version: each READY row shows it.
            rows.extend(IndexEntry(entry.name, "READY", entry.reason, origin, str(version),
                                   load_cause=residence.load_cause, pinned=residence.pinned,
                                   memory_bytes=residence.memory_bytes)
                        for version in sorted(entry.versions))
            if not ready_only:
                rows.extend(IndexEntry(entry.name, "UNAVAILABLE", reason, origin, str(version))
                            for version, reason in sorted(entry.failures.items()))
        return rows

