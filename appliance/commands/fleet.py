"""``appliance fleet``: every box on the LAN at a glance, from each box's own API.

Per box: name, address, hardware (its probe's summary), models ready/total (repository index),
requests/s and p50 latency over the last minute (history API: per-second rows; the p50 is the median
of the per-second medians, weighted by their requests) and version.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

from appliance.client.boxes import Box
from appliance.commands.targets import add_target_options, fetch_json, read_token, select_boxes
from appliance.settings import Settings

__all__ = ["add_parser", "box_summary", "minute_load", "run"]

WINDOW = 60


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("fleet", help="one table of every box on the LAN: hardware, models, load, version")
    add_target_options(parser, choose=False)
    parser.add_argument("--token-file", type=Path, help="the boxes' token, for boxes that protect inference")
    parser.add_argument("--json", action="store_true")


def minute_load(history: Any) -> tuple[float | None, float | None]:
    """(requests/s, p50 ms) over the window a history answer covers (per-second rows)."""
    series = history.get("series", {}) if isinstance(history, dict) else {}
    requests = series.get("requests") or []
    medians = series.get("p50_ms") or []
    counted = [(r, p) for r, p in zip(requests, medians) if r]
    if not isinstance(history, dict) or "requests" not in series:
        return None, None
    total = sum(r for r, _ in counted)
    rate = round(total / WINDOW, 2)
    weighted = sorted((p, r) for r, p in counted if p is not None)
    half, seen = sum(r for _, r in weighted) / 2, 0
    for p50, count in weighted:
        seen += count
        if seen >= half:
            return rate, round(p50, 3)
    return rate, None


def box_summary(box: Box, token: str | None) -> dict[str, Any]:
    """What `appliance fleet` shows of one box; ``error`` says why parts are missing."""
    row: dict[str, Any] = {"name": box.name, "address": box.url, "url": box.base_url, "hw": box.hw or None,
                           "models_ready": None, "models_total": None, "requests_per_s": None, "p50_ms": None,
                           "version": box.version or None, "error": None}
    problems = []
    try:
        status, metadata = fetch_json(box, "GET", "/v2", token=token)
        if status == 200 and isinstance(metadata, dict):
            row["version"] = metadata.get("version") or row["version"]
        status, index = fetch_json(box, "POST", "/v2/repository/index", b"{}", token)
        if status == 200 and isinstance(index, list):
            rows = [r for r in index if isinstance(r, dict)]
            row["models_ready"] = len({r.get("name") for r in rows if r.get("state") == "READY"})
            row["models_total"] = len({r.get("name") for r in rows})
        else:
            problems.append(f"repository index: HTTP {status}")
        status, probe = fetch_json(box, "GET", "/v2/probe", token=token)
        if status == 200 and isinstance(probe, dict) and probe.get("summary"):
            row["hw"] = probe["summary"]
        until = int(time.time())
        status, history = fetch_json(box, "GET", f"/v2/history?since={until - WINDOW}&until={until}&step=1",
                                     token=token)
        if status == 200:
            row["requests_per_s"], row["p50_ms"] = minute_load(history)
        else:
            problems.append(f"history: HTTP {status}")
    except OSError as exc:
        problems.append(f"unreachable: {exc}")
    row["error"] = "; ".join(problems) or None
    return row


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace, settings: Settings) -> int:
    token = read_token(args.token_file, settings)
    boxes = select_boxes(args, choose=False)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(boxes)))) as pool:
        rows = list(pool.map(lambda box: box_summary(box, token), boxes))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no appliances found")
        return 0
    table = [("name", "address", "hardware", "models", "req/s", "p50 ms", "version")]
    for row in rows:
        models = "-" if row["models_total"] is None else f"{row['models_ready']}/{row['models_total']}"
        hardware = (row["hw"] or "-").split("; runtimes")[0]  # the whole summary is in --json
        table.append((row["name"], row["address"], hardware[:70], models, _cell(row["requests_per_s"]),
                      _cell(row["p50_ms"]), _cell(row["version"])))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    for row in rows:
        if row["error"]:
            print(f"{row['name']}: {row['error']}")
    return 0
