"""Per-interval samples: the change of each model version's cumulative counters since the last tick.

Reading the counters the request path keeps anyway (``ModelStats``) costs the request path nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from appliance.engine.stats import ModelStats

__all__ = ["ModelSample", "Snapshotter", "merge_samples"]


@dataclasses.dataclass
class ModelSample:
    t: int
    model: str
    version: int
    requests: int = 0
    success: int = 0
    failure: int = 0
    failure_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    inferences: int = 0
    executions: int = 0
    latency_ns: int = 0
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    latency_hist: list[int] = dataclasses.field(default_factory=list)
    batch_hist: dict[str, int] = dataclasses.field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        for key in ("failure_reasons", "latency_hist", "batch_hist"):
            row[key] = json.dumps(row[key])
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelSample:
        values = dict(row)
        for key in ("failure_reasons", "latency_hist", "batch_hist"):
            values[key] = json.loads(values[key] or ("[]" if key == "latency_hist" else "{}"))
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass
class _Totals:
    success: int
    failure: int
    reasons: Counter
    inferences: int
    executions: int
    latency_ns: int
    queue_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int
    latency_hist: list[int]
    batch_hist: dict[int, int]

    @classmethod
    def of(cls, stats: ModelStats) -> _Totals:
        return cls(
            stats.success.count, stats.fail.count, Counter(stats.failures), stats.inference_count,
            stats.execution_count, stats.success.ns + stats.fail.ns, stats.queue.ns, stats.compute_input.ns,
            stats.compute_infer.ns, stats.compute_output.ns, list(stats.latency_histogram),
            stats.batch_histogram(),
        )


class Snapshotter:
    """Turns cumulative counters into per-tick deltas (a version seen for the first time starts at 0)."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, int], tuple[ModelStats, _Totals]] = {}

    def take(self, t: int, versions: list[tuple[str, int, ModelStats]]) -> list[ModelSample]:
        samples = []
        current: dict[tuple[str, int], tuple[ModelStats, _Totals]] = {}
        for model, version, stats in versions:
            now = _Totals.of(stats)
            key = (model, version)
            previous = self._previous.get(key)
            # A reloaded version has fresh counters: compare only against the same stats object.
            before = previous[1] if previous and previous[0] is stats else _Totals.of(ModelStats())
            current[key] = (stats, now)
            sample = ModelSample(
                t, model, version,
                requests=(now.success - before.success) + (now.failure - before.failure),
                success=now.success - before.success,
                failure=now.failure - before.failure,
                failure_reasons={k: v for k, v in (now.reasons - before.reasons).items() if v},
                inferences=now.inferences - before.inferences,
                executions=now.executions - before.executions,
                latency_ns=now.latency_ns - before.latency_ns,
                queue_ns=now.queue_ns - before.queue_ns,
                input_ns=now.input_ns - before.input_ns,
                infer_ns=now.infer_ns - before.infer_ns,
                output_ns=now.output_ns - before.output_ns,
                latency_hist=[a - b for a, b in zip(now.latency_hist, before.latency_hist)],
                batch_hist={str(k): v - before.batch_hist.get(k, 0) for k, v in now.batch_hist.items()
                            if v - before.batch_hist.get(k, 0)},
            )
            if sample.requests or sample.executions:
                samples.append(sample)
        self._previous = current
        return samples


def merge_samples(t: int, samples: list[ModelSample]) -> ModelSample:
    """Sum samples of one model version into one (the roll-ups)."""
    first = samples[0]
    merged = ModelSample(t, first.model, first.version, latency_hist=[0] * len(first.latency_hist))
    reasons: Counter = Counter()
    batches: Counter = Counter()
    for s in samples:
        for field in ("requests", "success", "failure", "inferences", "executions", "latency_ns", "queue_ns",
                      "input_ns", "infer_ns", "output_ns"):
            setattr(merged, field, getattr(merged, field) + getattr(s, field))
        reasons.update(s.failure_reasons)
        batches.update(s.batch_hist)
        if len(s.latency_hist) > len(merged.latency_hist):
            merged.latency_hist += [0] * (len(s.latency_hist) - len(merged.latency_hist))
        for i, count in enumerate(s.latency_hist):
            merged.latency_hist[i] += count
    merged.failure_reasons = dict(reasons)
    merged.batch_hist = dict(batches)
    return merged
