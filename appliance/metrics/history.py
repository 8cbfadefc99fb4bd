"""Time series from the metrics database, for the history API, the dashboard and ``appliance stats``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from appliance.core.errors import Unavailable
from appliance.engine.stats import LATENCY_BUCKETS_US
from appliance.metrics.samples import ModelSample, merge_samples
from appliance.metrics.store import connect

__all__ = ["history", "percentile_ms"]


def percentile_ms(histogram: list[int], fraction: float) -> float | None:
    """The latency (ms) under which ``fraction`` of the requests fell, interpolated linearly inside
    the histogram bucket that holds it (as Prometheus' histogram_quantile does)."""
    total = sum(histogram)
    if not total:
        return None
    threshold = fraction * total
    seen = 0
    for index, count in enumerate(histogram):
        if count and seen + count >= threshold:
            if index >= len(LATENCY_BUCKETS_US):
                return LATENCY_BUCKETS_US[-1] / 1000.0  # above the last bound: report the bound
            lower = LATENCY_BUCKETS_US[index - 1] if index else 0
            upper = LATENCY_BUCKETS_US[index]
            return round((lower + (upper - lower) * (threshold - seen) / count) / 1000.0, 4)
        seen += count
    return LATENCY_BUCKETS_US[-1] / 1000.0


_LEVELS = ("1s", "1m", "1h")


def _level(step: int) -> int:
    return 0 if step < 60 else 1 if step < 3600 else 2


def _rows(db: sqlite3.Connection, kind: str, level: int, since: int, until: int, where: str = "",
          args: tuple = ()) -> list[sqlite3.Row]:
    """Rows at the coarsest resolution that has them: the newest minutes and hours are not rolled up
    yet, so they come from the finer table underneath."""
    if level == 0:
        return db.execute(f"SELECT * FROM {kind}_1s WHERE t >= ? AND t < ?{where}", (since, until, *args)).fetchall()
    state = db.execute("SELECT value FROM state WHERE key = ?", (f"rolled_{_LEVELS[level]}",)).fetchone()
    boundary = min(max(state[0] if state else since, since), until)
    rows = db.execute(f"SELECT * FROM {kind}_{_LEVELS[level]} WHERE t >= ? AND t < ?{where}",
                      (since, boundary, *args)).fetchall()
    return rows + _rows(db, kind, level - 1, boundary, until, where, args)


def _model_series(db: sqlite3.Connection, since: int, until: int, step: int, model: str | None,
                  version: int | None) -> dict[str, list]:
    where = ""
    args: tuple[str | int, ...] = ()
    if model:
        where, args = " AND model = ?", (model,)
    if version is not None:
        where, args = where + " AND version = ?", (*args, version)
    buckets: dict[int, list[ModelSample]] = {}
    for row in _rows(db, "model", _level(step), since, until, where, args):
        sample = ModelSample.from_row(dict(row))
        buckets.setdefault(sample.t // step * step, []).append(sample)
    names = ("requests", "success", "failure", "inferences", "executions", "throughput", "p50_ms", "p90_ms",
             "p99_ms", "queue_ms", "compute_ms", "batch_size")
    series: dict[str, list] = {"t": [], **{name: [] for name in names}}
    for t in range(since // step * step, until, step):
        series["t"].append(t)
        samples = buckets.get(t)
        if not samples:
            for name in names:
                series[name].append(None)
            continue
        s = merge_samples(t, samples)
        series["requests"].append(s.requests)
        series["success"].append(s.success)
        series["failure"].append(s.failure)
        series["inferences"].append(s.inferences)
        series["executions"].append(s.executions)
        series["throughput"].append(round(s.requests / step, 3))
        series["p50_ms"].append(percentile_ms(s.latency_hist, 0.5))
        series["p90_ms"].append(percentile_ms(s.latency_hist, 0.9))
        series["p99_ms"].append(percentile_ms(s.latency_hist, 0.99))
        series["queue_ms"].append(round(s.queue_ns / s.requests / 1e6, 4) if s.requests else None)
        series["compute_ms"].append(round((s.input_ns + s.infer_ns + s.output_ns) / max(s.requests, 1) / 1e6, 4))
        series["batch_size"].append(round(s.inferences / s.executions, 3) if s.executions else None)
    return series


def _mean(rows: list[sqlite3.Row], column: str) -> float:
    return sum(r[column] or 0 for r in rows) / len(rows)


def _system_series(db: sqlite3.Connection, since: int, until: int, step: int) -> dict[str, list]:
    by_bucket: dict[int, list[sqlite3.Row]] = {}
    for row in _rows(db, "system", _level(step), since, until):
        by_bucket.setdefault(row["t"] // step * step, []).append(row)
    series: dict[str, list] = {k: [] for k in ("t", "cpu_percent", "memory_percent", "rss_bytes", "load1",
                                               "gpu_util_percent", "gpu_memory_percent")}
    for t in range(since // step * step, until, step):
        series["t"].append(t)
        rows = by_bucket.get(t)
        gpus = json.loads(rows[-1]["gpus"]) if rows and rows[-1]["gpus"] else []
        gpu = next((g for g in gpus if "utilization_percent" in g), None)
        series["cpu_percent"].append(round(_mean(rows, "cpu_percent"), 2) if rows else None)
        series["memory_percent"].append(round(_mean(rows, "memory_percent"), 2) if rows else None)
        series["rss_bytes"].append(int(_mean(rows, "rss_bytes")) if rows else None)
        series["load1"].append(round(_mean(rows, "load1"), 3) if rows else None)
        series["gpu_util_percent"].append(gpu["utilization_percent"] if gpu else None)
        series["gpu_memory_percent"].append(round(100 * gpu["memory_used"] / gpu["memory_total"], 2) if gpu else None)
    return series


def history(path: Path, since: int, until: int, step: int, model: str | None = None,
            version: int | None = None, immutable: bool = False) -> dict[str, Any]:
    """Series aligned on ``step``-second buckets from ``since`` to ``until`` (blocking: run off the loop).
    ``immutable``: the file is in a read-only state dir (the history recorded until it became so)."""
    step = max(1, step)
    if until <= since:
        raise ValueError("'until' must be after 'since'")
    if (until - since) // step > 20_000:
        raise ValueError(f"{(until - since) // step} points asked for; raise 'step' (at most 20000 points)")
    if not path.exists():
        empty: dict[str, list] = {"t": []}
        return {"since": since, "until": until, "step": step, "model": model, "series": empty, "system": empty,
                "events": []}
    try:
        return _query(path, immutable, since, until, step, model, version)
    except sqlite3.DatabaseError as exc:
        raise Unavailable(f"the metrics history in {path} cannot be read ({exc}); a corrupt file is moved "
                          f"aside when the daemon next starts with a writable state dir") from None


def _query(path: Path, immutable: bool, since: int, until: int, step: int, model: str | None,
           version: int | None) -> dict[str, Any]:
    db = connect(path, readonly=True, immutable=immutable)
    try:
        db.row_factory = sqlite3.Row
        series = _model_series(db, since, until, step, model, version)
        system = _system_series(db, since, until, step)
        db.row_factory = None
        events = [
            {"t": t, "kind": kind, "model": m, "version": v, "detail": json.loads(detail or "{}")}
            for t, kind, m, v, detail in db.execute(
                "SELECT t, kind, model, version, detail FROM events WHERE t >= ? AND t < ? ORDER BY t",
                (since, until))
            if model is None or m in (None, model)
        ]
    finally:
        db.close()
    return {"since": since, "until": until, "step": step, "model": model, "series": series, "system": system,
            "events": events}
