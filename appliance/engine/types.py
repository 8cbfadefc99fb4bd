"""Inference requests and responses as the core sees them: named numpy arrays, no wire format."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from appliance.engine.stats import StepTiming
    from appliance.engine.trace import Trace

__all__ = [
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "RequestedOutput",
    "SharedMemoryInput",
    "SharedMemoryRef",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor lies in a registered shared-memory region (Triton's ``shared_memory_region``,
    ``shared_memory_byte_size`` and ``shared_memory_offset`` parameters)."""

    region: str
    byte_size: int
    offset: int = 0

    def parameters(self) -> dict[str, Any]:
        """The three parameters as Triton writes them (the offset only when it is not 0)."""
        params: dict[str, Any] = {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size}
        if self.offset:
            params["shared_memory_offset"] = self.offset
        return params


@dataclasses.dataclass(slots=True)
class SharedMemoryInput:
    """An input whose data is in a shared-memory region: read into an ``InferInput`` by the data
    plane (``appliance.protocol.shared_memory.binding``) before the request is scheduled."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    source: SharedMemoryRef


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
    shared_memory: SharedMemoryRef | None = None
    """Write this output into a shared-memory region instead of the response."""

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
    shared_inputs: list[SharedMemoryInput] = dataclasses.field(default_factory=list)
    """Inputs still in shared memory; the data plane moves each into ``inputs`` before scheduling."""
    trace: Trace | None = None
    """Set by the data plane when this request is traced (see appliance.protocol.tracing)."""
    timing: StepTiming | None = None
    """Set by an ensemble for each of its steps: collects the step's queue and compute times."""
    cancelled: Callable[[], bool] | None = None
    """The caller's own cancellation probe, for a caller that asks the model to stop yet keeps reading
    its responses (a BLS stream's ``cancel()``); without one, a request is cancelled when its caller
    stops waiting for it."""

    @property
    def uses_shared_memory(self) -> bool:
        if self.shared_inputs:
            return True
        for output in self.outputs:  # noqa: SIM110 - a loop: any() over a generator costs a frame, every request
            if output.shared_memory is not None:
                return True
        return False


@dataclasses.dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    data: np.ndarray
    shared_memory: SharedMemoryRef | None = None
    """Set once the output has been written into a shared-memory region: the response then carries
    these parameters and no data."""


@dataclasses.dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: int
    outputs: list[InferOutput]
    id: str | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
