"""What the registry tells about its models: a log line when a model is ready, and the events the metrics
history records (model_loaded, model_failed, backend_chosen, model_unloaded)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from appliance.engine.model import ModelVersion

__all__ = ["ModelEvents"]

log = logging.getLogger("appliance.repository.registry")  # the lines operators know (and tests read)


class ModelEvents:
    def __init__(self, on_event: Callable[[str, str, int | None, dict], None] | None) -> None:
        """``on_event(kind, model, version, detail)``, None to record nothing."""
        self._on_event = on_event

    def emit(self, kind: str, model: str, version: int | None, detail: dict) -> None:
        if self._on_event is not None:
            self._on_event(kind, model, version, detail)

    def loaded(self, name: str, versions: Mapping[int, ModelVersion], failures: Mapping[int, str]) -> None:
        """A load that made ``name`` ready: its versions, the plan each got, the versions that failed."""
        log.info("model %s ready: versions %s on %s%s", name, sorted(versions), versions[max(versions)].platform,
                 f" (failed: {dict(failures)})" if failures else "")
        for number, model in sorted(versions.items()):
            self.emit("model_loaded", name, number, {"platform": model.platform, "backend": model.backend_name})
            if model.selection is not None:
                self.emit("backend_chosen", name, number, {
                    "chosen": model.selection.get("chosen"), "cache": model.selection.get("cache"),
                    "candidates": model.selection.get("candidates", [])})
        for number, reason in sorted(failures.items()):
            self.emit("model_failed", name, number, {"reason": reason})
