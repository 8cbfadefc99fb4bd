"""What both Python backends (a model process per instance; in process for trusted models) answer alike:
the tensors and completed config a model.py declares (its config.pbtxt as its ``auto_complete_config()``
left it), and ``run`` as one request of ``run_requests``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from google.protobuf import json_format

from appliance.backends.base import Backend, BackendRequest, LoadContext, reschedule_refused
from appliance.core.errors import ConfigError

__all__ = ["ModelPyBackend"]


class ModelPyBackend(Backend):
    """A backend running a model.py; a subclass sets ``_context`` and ``_described`` (the completed config
    as JSON) while it loads."""

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

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        (result,) = self.run_requests([BackendRequest(inputs, outputs)]).results
        if isinstance(result, Future):  # answered through its response sender
            result = result.result()
        if isinstance(result, BaseException):
            raise result
        if not isinstance(result, dict):
            raise reschedule_refused(self._context.model_name)
        return result
