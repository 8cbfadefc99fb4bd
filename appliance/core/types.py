"""Inference requests and responses as the core sees them: named numpy arrays, no wire format."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["InferInput", "InferOutput", "InferRequest", "InferResponse", "RequestedOutput"]


@dataclasses.dataclass(slots=True)
class InferInput:
    name: str
    datatype: str
    data: np.ndarray
    """Already shaped as the client declared; BYTES are object arrays of ``bytes``."""


@dataclasses.dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def classification(self) -> int:
        return int(self.parameters.get("classification", 0) or 0)


@dataclasses.dataclass(slots=True)
class InferRequest:
    inputs: list[InferInput]
    outputs: list[RequestedOutput] = dataclasses.field(default_factory=list)
    """Empty means every output the model has."""
    id: str | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    data: np.ndarray


@dataclasses.dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: int
    outputs: list[InferOutput]
    id: str | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
