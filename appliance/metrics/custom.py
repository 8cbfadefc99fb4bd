"""Metric families that models define (Triton's Python ``pb_utils.MetricFamily``), exported on /metrics.

Thread-safe: model processes update them from the Python backend's reader threads while /metrics is
scraped. A family belongs to the models that created it; it disappears when the last of them is gone.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
import threading
from collections.abc import Sequence

__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "CustomMetrics"]

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
_KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclasses.dataclass(eq=False)
class _Series:
    family: _Family
    labels: dict[str, str]
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] = dataclasses.field(default_factory=list)
    total: float = 0.0
    owners: set[object] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(eq=False)
class _Family:
    name: str
    description: str
    kind: int
    owners: set[object] = dataclasses.field(default_factory=set)
    series: dict[tuple, _Series] = dataclasses.field(default_factory=dict)


class CustomMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._ids = itertools.count(1)
        self._by_id: dict[int, _Series] = {}

    def family(self, owner: object, name: str, description: str, kind: int) -> None:
        """Define (or join) a family; ValueError when the name is invalid, reserved or taken by a
        family of another kind or description."""
        if not _NAME.fullmatch(name) or name.startswith("nv_"):
            raise ValueError(f"metric family name {name!r} is invalid: use letters, digits, '_' and ':' (not "
                             "starting with a digit), and not the prefix 'nv_' (the server's own metrics)")
        if kind not in _KINDS:
            raise ValueError(f"unknown metric kind {kind}: use MetricKind.COUNTER, GAUGE or HISTOGRAM")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, kind)
            elif family.kind != kind or family.description != description:
                raise ValueError(
                    f"metric family '{name}' already exists as a {_KINDS[family.kind]} described "
                    f"{family.description!r}; a family with the same name must have the same kind and description"
                )
            family.owners.add(owner)

    def metric(self, owner: object, name: str, labels: dict[str, str], buckets: Sequence[float] | None) -> int:
        """A series of family ``name`` with these labels (the same series for the same labels)."""
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"metric label name {label!r} is invalid")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                raise ValueError(f"metric family '{name}' does not exist")
            if family.kind == HISTOGRAM:
                if not buckets or list(buckets) != sorted(set(buckets)):
                    raise ValueError("a histogram's buckets must be a non-empty, strictly increasing list")
            elif buckets is not None:
                raise ValueError(f"buckets are only for histograms; '{name}' is a {_KINDS[family.kind]}")
            key = tuple(sorted(labels.items()))
            series = family.series.get(key)
            if series is None:
                bounds = tuple(buckets or ())
                series = family.series[key] = _Series(family, dict(labels), buckets=bounds,
                                                      counts=[0] * (len(bounds) + 1))
            elif family.kind == HISTOGRAM and tuple(buckets or ()) != series.buckets:
                raise ValueError(f"metric '{name}' {labels} already exists with buckets {list(series.buckets)}")
            series.owners.add(owner)
            metric_id = next(self._ids)
            self._by_id[metric_id] = series
            return metric_id

    def update(self, metric_id: int, operation: str, value: float) -> None:
        with self._lock:
            series = self._by_id.get(metric_id)
            if series is None:
                return
            if operation == "increment":
                series.value += value
            elif operation == "set":
                series.value = value
            elif operation == "observe":
                series.counts[bisect.bisect_left(series.buckets, value)] += 1
                series.total += value

    def value(self, metric_id: int) -> float:
        with self._lock:
            series = self._by_id.get(metric_id)
            if series is None:
                raise ValueError("this metric no longer exists")
            return series.value

    def release(self, owner: object) -> None:
        """``owner`` (a model process) is gone: drop what only it used."""
        with self._lock:
            for metric_id, series in list(self._by_id.items()):
                series.owners.discard(owner)
                if not series.owners:
                    del self._by_id[metric_id]
                    series.family.series.pop(tuple(sorted(series.labels.items())), None)
            for name, family in list(self._families.items()):
                family.owners.discard(owner)
                if not family.owners and not family.series:
                    del self._families[name]

    def exposition(self) -> str:
        """The families in Prometheus text format, named exactly as the model named them (Triton's
        exporter adds no ``_total`` suffix to counters)."""
        with self._lock:
            families = [(f.name, f.description, f.kind, [(dict(s.labels), s.value, s.buckets, list(s.counts),
                                                           s.total) for s in f.series.values()])
                        for f in self._families.values()]
        lines: list[str] = []
        for name, description, kind, series in families:
            lines.append(f"# HELP {name} {_escape_help(description)}")
            lines.append(f"# TYPE {name} {_KINDS[kind]}")
            for labels, value, buckets, counts, total in series:
                if kind != HISTOGRAM:
                    lines.append(f"{name}{_labels(labels)} {_number(value)}")
                    continue
                cumulative = list(itertools.accumulate(counts))
                for bound, count in [*zip((_number(b) for b in buckets), cumulative), ("+Inf", cumulative[-1])]:
                    lines.append(f"{name}_bucket{_labels({**labels, 'le': bound})} {count}")
                lines.append(f"{name}_sum{_labels(labels)} {_number(total)}")
                lines.append(f"{name}_count{_labels(labels)} {cumulative[-1]}")
        return "\n".join(lines) + "\n" if lines else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_label_value(value)}"' for key, value in labels.items()) + "}"
