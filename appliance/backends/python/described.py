"""What a model.py declares about itself: its config.pbtxt as its ``auto_complete_config()`` left it. Both
Python backends (a model process, or in process for trusted models) answer the core's questions from it."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from appliance.backends.base import LoadContext
from appliance.errors import ConfigError

__all__ = ["DescribedTensors"]


class DescribedTensors:
    """The ``Backend`` methods answered from ``_described`` (the completed config as JSON); the class that
    mixes this in sets ``_context`` and ``_described`` while it loads."""

    _context: LoadContext
    _described: dict

    # A model.py declares its tensors in config.pbtxt or auto_complete_config(): the core checks those
    # declarations (None); a model that declares none has none, which Triton allows (a BLS driver).
    def inputs(self) -> list | None:
        return None if self._described.get("input") else []

    def outputs(self) -> list | None:
        return None if self._described.get("output") else []

    def completed_config(self, config: Any) -> Any:
        """The config after the model's own auto_complete_config()."""
        completed = type(config)()
        try:
            json_format.ParseDict(self._described, completed, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise ConfigError(
                f"auto_complete_config() of {self._context.model_file} made an invalid config: {exc}"
            ) from exc
        return completed
