"""``appliance stats [MODEL]``: on-device history from <state-dir>/metrics.db, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from appliance.core.errors import ConfigError
from appliance.metrics.history import history
from appliance.settings import Settings

__all__ = ["add_parser", "run"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    try:
        return int(float(text[:-1]) * _UNITS[text[-1]]) if text[-1] in _UNITS else int(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected a duration such as 90s, 15m, 1h or 7d, got {text!r}") from None


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("stats", help="request counts, latency and batch sizes from the on-device history")
    parser.add_argument("model", nargs="?", help="one model (default: all)")
    parser.add_argument("--since", type=_duration, default=3600, help="how far back (default 1h)")
    parser.add_argument("--step", type=_duration, default=60, help="row width (default 1m)")
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir")
    parser.add_argument("--json", action="store_true")


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.server.metrics_db.exists():
        raise ConfigError(f"no metrics history at {settings.server.metrics_db}; is --state-dir the daemon's?")
    until = int(time.time()) + 1
    result = history(settings.server.metrics_db, until - args.since, until, args.step, args.model)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    series = result["series"]
    columns = ("requests", "failure", "throughput", "p50_ms", "p99_ms", "queue_ms", "batch_size")
    rows: list[tuple[str, ...]] = [("time", *columns)]
    for i, t in enumerate(series["t"]):
        if series["requests"][i] is None:
            continue
        rows.append((time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)), *(_cell(series[c][i]) for c in columns)))
    total = sum(r for r in series["requests"] if r)
    failed = sum(r for r in series["failure"] if r)
    print(f"{args.model or 'all models'}: {total} requests ({failed} failed) in the last {args.since} s")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return 0
