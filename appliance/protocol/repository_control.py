"""Triton's model repository extension through the data plane: the index, load (with a config override,
or with the model's files: a push) and unload, in every model control mode's rules."""

from __future__ import annotations

import asyncio
from typing import Any

from appliance.errors import ConfigError, InvalidInput, NotSupported, PayloadTooLarge, PushRefused, PushTooLarge
from appliance.protocol.results import IndexEntry
from appliance.repository.config import config_from_json
from appliance.repository.pushed import FILE_PREFIX, PushStore, file_parameters
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
            raise InvalidInput(
                f"explicit model {action} is not allowed in model control mode {self._control_mode!r}; "
                "start the daemon with --model-control-mode explicit"
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
        override = _config(name, parameters)
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
        # Triton's words first ("failed to poll from model repository" is what Triton says of file
        # overrides it cannot use), then what is wrong.
        try:
            override, files = self._push_request(self._pushes, name, parameters)
        except (InvalidInput, PayloadTooLarge) as exc:
            refusal = PushTooLarge if isinstance(exc, PayloadTooLarge) else PushRefused
            raise refusal(f"failed to load '{name}', failed to poll from model repository: {exc.message}") from None
        async with self._lock(name):
            with self._registry.hold(name):
                await self._stage_and_load(self._pushes, name, override, files)

    @staticmethod
    def _push_request(store: PushStore, name: str, parameters: dict[str, Any]) -> tuple[Any, dict[str, bytes]]:
        """The pushed config and files, checked (InvalidInput or PayloadTooLarge saying what is wrong)."""
        if "config" not in parameters:  # Triton's rule: the override directory's files come with a config
            raise InvalidInput("file overrides need the 'config' parameter (the model's configuration as JSON): the "
                               "pushed files replace the model's directory")
        override = _config(name, parameters)
        files = file_parameters(parameters, store.limits.max_file_bytes)
        if not any("/" in relative and relative.split("/")[0].isdigit() for relative in files):
            raise InvalidInput("the pushed files have no version directory; send the model file as "
                               "'file:1/<file name>' (e.g. file:1/model.onnx)")
        return override, files

    async def _stage_and_load(self, store: PushStore, name: str, override: Any, files: dict[str, bytes]) -> None:
        staged = await asyncio.to_thread(store.stage, name, override, files)
        try:  # loaded beside the serving versions: requests switch over once it is ready
            await self._registry.load(name, None, source=staged.model_dir)
        except BaseException:
            await asyncio.to_thread(store.discard, staged)
            if not self._registry.in_repository(name) and name not in store.model_dirs():
                self._registry.forget(name)  # a failed first push leaves no entry behind
            raise
        replaced = await asyncio.to_thread(store.commit, staged)
        if replaced is not None:  # the versions it served are closed by now
            await asyncio.to_thread(store.remove_generation, replaced)

    async def unload(self, name: str, parameters: dict[str, Any]) -> None:
        """Unload; ``parameters.unload_dependents`` (a boolean) also unloads the composing models of an
        ensemble that no other loaded ensemble uses. A pushed model's files are removed (as Triton removes
        an override directory at unload)."""
        pushed = self._pushed(name)
        if not pushed:
            self._check_control("unload")
        self._registry.model_dir(name)
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
            if entry.state is not ModelState.READY:
                if not ready_only:
                    rows.append(IndexEntry(entry.name, entry.state.value, entry.reason, origin))
                continue
            rows.extend(IndexEntry(entry.name, "READY", entry.reason, origin, str(version))
                        for version in sorted(entry.versions))
            if not ready_only:
                rows.extend(IndexEntry(entry.name, "UNAVAILABLE", reason, origin, str(version))
                            for version, reason in sorted(entry.failures.items()))
        return rows


def _config(name: str, parameters: dict[str, Any]) -> Any:
    if "config" not in parameters:
        return None
    try:
        return config_from_json(parameters["config"], name)
    except ConfigError as exc:
        raise ConfigError(f"failed to load '{name}': {exc.message}") from None
