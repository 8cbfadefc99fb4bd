"""What the data plane answers, typed: each front end turns these into its wire format (REST into
JSON with ``as_json``, gRPC into the protobuf message field by field). Nothing here knows a transport."""

from __future__ import annotations

import dataclasses
from typing import Any

from appliance.engine.types import InferRequest, InferResponse

__all__ = [
    "Health",
    "IndexEntry",
    "InferResult",
    "ModelMetadata",
    "RegionStatus",
    "ServerMetadata",
    "TensorMetadata",
    "VersionStatistics",
]


class _FieldsAsJson:
    """A result whose JSON is its fields, in their order, tuples as lists."""

    __slots__ = ()

    def as_json(self) -> dict[str, Any]:
        values = ((field.name, getattr(self, field.name)) for field in dataclasses.fields(self))  # type: ignore[arg-type]
        return {name: list(value) if isinstance(value, tuple) else value for name, value in values}


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    live: bool
    ready: bool
    failure: str | None
    """Why the server stopped being live (None while it is)."""
    state: dict[str, Any]
    """The state dir's condition (read-only, a database moved aside...), as JSON."""
    box: dict[str, str]
    """Which box answers: its name (the fleet name, else the host's) and host name, for people (the
    dashboard's header), never for clients to parse as Triton's server name."""

    def as_json(self) -> dict[str, Any]:
        details: dict[str, Any] = {"live": self.live, "ready": self.ready, "state": self.state, "box": self.box}
        if self.failure is not None:
            details["failure"] = self.failure
        return details


@dataclasses.dataclass(frozen=True, slots=True)
class ServerMetadata(_FieldsAsJson):
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMetadata(_FieldsAsJson):
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "versions": list(self.versions), "platform": self.platform,
                "inputs": [t.as_json() for t in self.inputs], "outputs": [t.as_json() for t in self.outputs]}


@dataclasses.dataclass(frozen=True, slots=True)
class VersionStatistics:
    name: str
    version: str
    statistics: dict[str, Any]
    """Triton's statistics of one version in its JSON form (inference_stats, batch_stats...), plus the
    appliance's own members (sequence_stats) that Triton's gRPC message has no field for."""

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, **self.statistics}


@dataclasses.dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of Triton's repository index, with the appliance's ``origin``: "repository", or "pushed"
    (its files came in a load request), and, while load on demand, idle unload, a memory budget or
    pressure is on (docs/memory.md), why the model is loaded or not and what it holds. Triton's clients
    read the keys they know and leave the others (the gRPC index carries Triton's four fields only)."""

    name: str
    state: str
    reason: str
    origin: str
    version: str | None = None
    """None for a row about the model rather than one of its versions (it is not READY)."""
    load_cause: str | None = None
    """Why a READY model is loaded: "start", "demand" or "explicit" (the load API, a re-scan, a step)."""
    unload_cause: str | None = None
    """Why the appliance unloaded a model that is not loaded again: "idle", "budget" or "pressure"."""
    pinned: bool = False
    memory_bytes: int | None = None
    """What the loaded model holds, as last measured (its model processes' RSS, the daemon's growth)."""

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name}
        if self.version is not None:
            row["version"] = self.version
        row["state"] = self.state
        if self.reason:  # Triton leaves an empty reason out
            row["reason"] = self.reason
        row["origin"] = self.origin
        if self.load_cause is not None:
            row["load_cause"] = self.load_cause
        if self.unload_cause is not None:
            row["unload_cause"] = self.unload_cause
        if self.pinned:
            row["pinned"] = True
        if self.memory_bytes is not None:
            row["memory_bytes"] = self.memory_bytes
        return row


@dataclasses.dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered shared-memory region: ``key`` and ``offset`` for system ones, ``device_id`` for CUDA."""

    name: str
    key: str | None = None
    offset: int | None = None
    device_id: int | None = None
    byte_size: int = 0

    @classmethod
    def of(cls, fields: dict[str, Any]) -> RegionStatus:
        return cls(**fields)

    def as_json(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}


@dataclasses.dataclass(slots=True)
class InferResult:
    """One inference: the request as decoded (its requested outputs steer the encoding) and the answer."""

    request: InferRequest
    response: InferResponse
