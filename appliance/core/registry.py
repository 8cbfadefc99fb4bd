"""The model registry: what the repository holds, what is ready, and lookups for the request path."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import RuntimeOptions
from appliance.core.loader import LoadedModel, load_model
from appliance.core.model import ModelVersion
from appliance.errors import ApplianceError, InvalidInput, ModelNotFound, ModelNotReady

if TYPE_CHECKING:
    from appliance.selection import Selector

__all__ = ["ModelEntry", "ModelRegistry", "ModelState", "parse_version"]

log = logging.getLogger(__name__)


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

    def latest(self) -> ModelVersion:
        if not self.versions:
            raise ModelNotReady(f"model '{self.name}' is not ready: {self.reason or self.state.value}")
        return self.versions[max(self.versions)]


def parse_version(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 18:
        raise InvalidInput(f"model version must be a positive integer, got {text!r}")
    return int(text)


class ModelRegistry:
    def __init__(self, repository: Path, options: RuntimeOptions, selector: Selector | None = None,
                 retune: bool = False) -> None:
        self.repository = repository
        self._options = options
        self.selector = selector
        """Set before load_all(); None serves each model with its config's backend as is."""
        self.on_event: Callable[..., None] | None = None
        """Told of model_loaded / model_failed / backend_chosen / model_unloaded (kind, model, version,
        detail): the metrics history records them."""
        self._retune = retune
        self._models: dict[str, ModelEntry] = {}

    def scan(self) -> list[Path]:
        """Model directories in the repository (hidden entries and plain files are skipped)."""
        if not self.repository.is_dir():
            raise FileNotFoundError(
                f"model repository {self.repository} does not exist or is not a directory; "
                "pass --model-repository DIR pointing at a Triton-layout repository"
            )
        return sorted(p for p in self.repository.iterdir() if p.is_dir() and not p.name.startswith("."))

    def discover(self) -> list[Path]:
        """Scan the repository and list its models as LOADING (blocking: call off the loop)."""
        paths = self.scan()
        for path in paths:
            self._models.setdefault(path.name, ModelEntry(path.name))
        return paths

    async def load_all(self) -> None:
        """Load every discovered model, concurrently: a model with a cached plan is ready while
        another one is still measuring its candidates (the selector lets one model tune at a time).
        A model that fails is recorded UNAVAILABLE with its reason."""
        if not self._models:
            await asyncio.to_thread(self.discover)
        paths = [self.repository / name for name in self._models]
        await asyncio.gather(*(self._load(path) for path in paths))

    async def rescan(self, timeout: float) -> dict[str, list[str]]:
        """Load models that appeared in the repository and unload (after draining) those that went
        away; models already loaded keep serving untouched."""
        paths = await asyncio.to_thread(self.scan)
        present = {p.name for p in paths}
        added = [p for p in paths if p.name not in self._models]
        removed = sorted(name for name in self._models if name not in present)
        for path in added:
            self._models[path.name] = ModelEntry(path.name)
        await asyncio.gather(*(self._load(path) for path in added))
        for name in removed:
            entry = self._models.pop(name)
            for model in [m for _, m in sorted(entry.versions.items())]:
                await model.drain(timeout)
                for error in await model.close():
                    log.error("error while unloading %s: %s", name, error)
                self._emit("model_unloaded", name, model.version, {"reason": "removed from the repository"})
        return {"added": sorted(p.name for p in added), "removed": removed}

    async def _load(self, path: Path) -> None:
        entry = self._models[path.name]
        try:
            loaded: LoadedModel = await asyncio.to_thread(
                load_model, path, self._options, self.selector, self._retune
            )
        except ApplianceError as exc:
            entry.state, entry.reason = ModelState.UNAVAILABLE, exc.message
            log.error("model %s failed to load: %s", path.name, exc.message)
            self._emit("model_failed", entry.name, None, {"reason": entry.reason})
            return
        except Exception as exc:
            entry.state, entry.reason = ModelState.UNAVAILABLE, f"{type(exc).__name__}: {exc}"
            log.exception("model %s failed to load", path.name)
            self._emit("model_failed", entry.name, None, {"reason": entry.reason})
            return
        for model in loaded.versions.values():
            model.start()
        entry.config, entry.versions, entry.failures = loaded.config, loaded.versions, loaded.failures
        entry.state, entry.reason = ModelState.READY, ""
        log.info(
            "model %s ready: versions %s on %s%s",
            entry.name, sorted(entry.versions), entry.latest().platform,
            f" (failed: {loaded.failures})" if loaded.failures else "",
        )
        for number, model in sorted(entry.versions.items()):
            self._emit("model_loaded", entry.name, number, {"platform": model.platform, "backend": model.backend.name})
            if model.selection is not None:
                self._emit("backend_chosen", entry.name, number, {
                    "chosen": model.selection.get("chosen"), "cache": model.selection.get("cache"),
                    "candidates": model.selection.get("candidates", [])})
        for number, reason in sorted(entry.failures.items()):
            self._emit("model_failed", entry.name, number, {"reason": reason})

    def _emit(self, kind: str, model: str, version: int | None, detail: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, model, version, detail)

    def ready_versions(self) -> list[ModelVersion]:
        return [m for e in self._models.values() for _, m in sorted(e.versions.items())]

    def entries(self) -> list[ModelEntry]:
        return [self._models[name] for name in sorted(self._models)]

    def entry(self, name: str) -> ModelEntry:
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The ready model version a request names (the newest ready one when no version is given)."""
        entry = self.entry(name)
        number = parse_version(version)
        if number is None:
            return entry.latest()
        model = entry.versions.get(number)
        if model is None:
            if number in entry.failures:
                raise ModelNotReady(
                    f"model '{name}' version {number} is not ready: {entry.failures[number]}"
                )
            raise ModelNotFound(
                f"Request for unknown model: '{name}' version {number} is not found; "
                f"available versions: {sorted(entry.versions) or 'none'}"
            )
        return model

    @property
    def all_ready(self) -> bool:
        return all(e.state is ModelState.READY and not e.failures for e in self._models.values())

    def ready_count(self) -> int:
        return sum(1 for e in self._models.values() if e.state is ModelState.READY)

    async def close(self, timeout: float) -> list[BaseException]:
        """Let in-flight requests finish (bounded by ``timeout``), then free every instance."""
        models = self.ready_versions()
        await asyncio.gather(*(m.drain(timeout) for m in models))
        errors: list[BaseException] = []
        for model in models:
            errors.extend(await model.close())
            self._emit("model_unloaded", model.name, model.version, {})
        for entry in self._models.values():
            entry.versions.clear()
            entry.state, entry.reason = ModelState.UNAVAILABLE, "server is shutting down"
        return errors
