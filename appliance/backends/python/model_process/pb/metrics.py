"""Custom metrics (``pb_utils.MetricFamily``/``Metric``), exported on the daemon's /metrics.

The family and each labelled metric are created in the daemon (which checks names and conflicts);
updates are sent without waiting (the channel keeps them in order, so ``value()`` sees every update
made before it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.errors import TritonModelException
from appliance.backends.python.wire.messages import MetricUpdate

__all__ = ["Metric", "MetricFamily", "MetricKind"]


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class Metric:
    def __init__(self, family: MetricFamily, labels: dict[str, str] | None, buckets: Sequence[float] | None) -> None:
        self._kind = family.kind
        self._id = runtime.current().ask(
            "metric", family.name, {str(k): str(v) for k, v in (labels or {}).items()},
            None if buckets is None else [float(b) for b in buckets])

    def increment(self, value: float) -> None:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException("increment() is not supported on a histogram metric; use observe()")
        if self._kind is MetricKind.COUNTER and value < 0:
            raise TritonModelException("a counter can only go up: increment() takes a value >= 0")
        runtime.current().send(MetricUpdate("increment", self._id, float(value)))

    def set(self, value: float) -> None:
        if self._kind is not MetricKind.GAUGE:
            raise TritonModelException("set() is supported only on a gauge metric")
        runtime.current().send(MetricUpdate("set", self._id, float(value)))

    def observe(self, value: float) -> None:
        if self._kind is not MetricKind.HISTOGRAM:
            raise TritonModelException("observe() is supported only on a histogram metric")
        runtime.current().send(MetricUpdate("observe", self._id, float(value)))

    def value(self) -> float:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException("value() is not supported on a histogram metric")
        return float(runtime.current().ask("metric_value", self._id))


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name, self.description, self.kind = name, description, MetricKind(kind)
        runtime.current().ask("metric_family", name, description, int(self.kind))

    def Metric(self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        if self.kind is MetricKind.HISTOGRAM and buckets is None:
            raise TritonModelException("a histogram metric needs buckets: Metric(labels=..., buckets=[...])")
        return Metric(self, labels, buckets)
