"""A request's trace (Triton's trace extension): the timestamps it collects on its way through the
engine. Which requests are traced, and where traces go, is the protocol's business
(``appliance.protocol.tracing``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

__all__ = ["Trace"]


@dataclasses.dataclass(eq=False, slots=True)
class Trace:
    id: int
    model_name: str
    model_version: int
    timestamps: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    sink: Any = None
    """Whatever the tracer needs to file the finished trace (the protocol's, opaque here)."""
    parent: Any = None
    """The caller's span, from the W3C ``traceparent`` the request carried (OpenTelemetry mode: the
    exporter's, opaque here), else None."""

    def mark(self, name: str, ns: int | None = None) -> None:
        self.timestamps.append((name, time.monotonic_ns() if ns is None else ns))

    def to_json(self) -> dict[str, Any]:
        """As Triton writes a trace in its trace file."""
        return {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "timestamps": [{"name": name, "ns": ns} for name, ns in self.timestamps],
        }
