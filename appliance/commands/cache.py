"""``appliance cache ls|clear``: the model cache in the state dir."""

from __future__ import annotations

import argparse
import time
from typing import Any

from model_cache import ModelCache

from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("cache", help="list or clear the model cache (chosen plans + compiled artefacts)")
    parser.add_argument("action", choices=["ls", "clear"])
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir")


def run(args: argparse.Namespace, settings: Settings) -> int:
    cache = ModelCache(settings.cache_dir, settings.cache_max_bytes)
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.root}")
        return 0
    entries = cache.entries()
    print(f"{cache.root}: {len(entries)} entries, {sum(e.size for e in entries)} bytes (limit {cache.max_bytes})")
    for entry in entries:
        d = entry.decision
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used)) if entry.last_used else "-"
        print(f"  {entry.key}  {d.get('model')}:{d.get('version')}  {d.get('chosen')}  {entry.size} B  used {used}")
    return 0
