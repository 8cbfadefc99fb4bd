"""The reads both HTTP paths serve — aiohttp's routes (handlers.py) and the infer lane (lane.py): what each
answers is decided here, once; each path writes the answer in its own way."""

from __future__ import annotations

from typing import Any

from appliance.core.config_json import config_to_json
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation

__all__ = ["MODEL_NOT_READY", "READS", "answer_read"]

MODEL_NOT_READY = "Model version not ready"
"""Triton's answer to GET .../ready for a model that does not serve (unknown models included)."""

READS = frozenset({Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.MODEL_READY, Operation.MODEL_METADATA,
                   Operation.MODEL_CONFIG})


def answer_read(plane: DataPlane, operation: Operation, model: str = "",
                version: str | None = None) -> tuple[int, Any, str | None]:
    """(status, JSON body or None, error message or None) for one of ``READS``; refusals the data plane
    raises (an unknown model's metadata...) propagate as ApplianceErrors."""
    if operation is Operation.SERVER_LIVE:
        return (200 if plane.live() else 503), None, None
    if operation is Operation.SERVER_READY:
        return (200 if plane.ready() else 503), None, None
    if operation is Operation.MODEL_READY:
        return (200, None, None) if plane.model_ready(model, version) else (400, None, MODEL_NOT_READY)
    if operation is Operation.MODEL_METADATA:
        return 200, plane.model_metadata(model, version).as_json(), None
    if operation is Operation.MODEL_CONFIG:
        return 200, config_to_json(plane.model_config(model, version)), None
    raise ValueError(f"{operation} is not a read both HTTP paths serve")
