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


_COUNTERS = ("requests", "success", "failure", "inferences", "executions", "latency_ns", "queue_ns", "input_ns",
             "infer_ns", "output_ns")
"""The fields of a sample that are plain counts: a tick's change is their difference, a roll-up their sum."""


def _totals(stats: ModelStats) -> ModelSample:
    """The version's cumulative counters as one sample (no time, model or version of its own)."""
    success, failure = stats.success, stats.fail
    compute_input, compute_infer, compute_output = stats.compute()
    return ModelSample(
        0, "", 0, requests=success.count + failure.count, success=success.count, failure=failure.count,
        failure_reasons=dict(stats.failures), inferences=stats.inference_count, executions=stats.execution_count,
        latency_ns=success.ns + failure.ns, queue_ns=stats.queue.ns, input_ns=compute_input.ns,
        infer_ns=compute_infer.ns, output_ns=compute_output.ns, latency_hist=list(stats.latency_histogram),
        batch_hist={str(size): count for size, count in stats.batch_histogram().items()},
    )


def _change(t: int, model: str, version: int, now: ModelSample, before: ModelSample) -> ModelSample:
    """What the counters gained from ``before`` to ``now`` (zero changes left out of the reasons and batches)."""
    sample = ModelSample(t, model, version, **{name: getattr(now, name) - getattr(before, name) for name in _COUNTERS})
    sample.failure_reasons = dict(Counter(now.failure_reasons) - Counter(before.failure_reasons))
    sample.latency_hist = [a - b for a, b in zip(now.latency_hist, before.latency_hist)]
    sample.batch_hist = {size: count - before.batch_hist.get(size, 0) for size, count in now.batch_hist.items()
                         if count - before.batch_hist.get(size, 0)}
    return sample


class Snapshotter:
    """Turns cumulative counters into per-tick deltas (a version seen for the first time starts at 0). What
    a version's counters gained since the last tick is counted even when they went away meanwhile: a
    reload (fresh counters in their place) or an unload would otherwise drop up to a tick of its traffic."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, int], tuple[ModelStats, ModelSample]] = {}

    def take(self, t: int, versions: list[tuple[str, int, ModelStats]]) -> list[ModelSample]:
        samples = []
        current: dict[tuple[str, int], tuple[ModelStats, ModelSample]] = {}
        for model, version, stats in versions:
            now = _totals(stats)
            key = (model, version)
            previous = self._previous.get(key)
            current[key] = (stats, now)
            if previous is not None and previous[0] is stats:
                sample = _change(t, model, version, now, previous[1])
            else:  # fresh counters (a reloaded version's start at 0), and the last gains of those they replaced
                sample = _change(t, model, version, now, _ZERO)
                if previous is not None:
                    sample = merge_samples(t, [sample, _last_gains(t, key, previous)])
            if sample.requests or sample.executions:
                samples.append(sample)
        for key, previous in self._previous.items():
            if key not in current:  # unloaded since the last tick
                sample = _last_gains(t, key, previous)
                if sample.requests or sample.executions:
                    samples.append(sample)
        self._previous = current
        return samples


_ZERO = _totals(ModelStats())


def _last_gains(t: int, key: tuple[str, int], previous: tuple[ModelStats, ModelSample]) -> ModelSample:
    """What a version's counters that are no longer served gained after the last tick."""
    stats, before = previous
    return _change(t, key[0], key[1], _totals(stats), before)


def merge_samples(t: int, samples: list[ModelSample]) -> ModelSample:
    """Sum samples of one model version into one (the roll-ups)."""
    first = samples[0]
    merged = ModelSample(t, first.model, first.version, latency_hist=[0] * len(first.latency_hist))
    reasons: Counter = Counter()
    batches: Counter = Counter()
    for s in samples:
        for field in _COUNTERS:
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
