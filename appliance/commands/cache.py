"""``appliance cache ls|clear``: the model cache in the state dir."""

from __future__ import annotations

import argparse
import time
from typing import Any

from appliance.core.errors import ConfigError
from appliance.settings import Settings
from model_cache import ModelCache

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("cache", help="list or clear the model cache (chosen plans + compiled artefacts)")
    parser.add_argument("action", choices=["ls", "clear"])
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir")


def _clear(settings: Settings) -> int:
    if not settings.server.cache_dir.is_dir():
        print(f"removed 0 entries: there is no model cache at {settings.server.cache_dir}")
        return 0
    cache = ModelCache(settings.server.cache_dir, settings.selection.cache_max_bytes)
    try:
        removed = cache.clear()
    except OSError as exc:
        raise ConfigError(f"cannot clear the model cache {cache.root}: {exc.strerror or exc}; if its filesystem "
                          f"is mounted read-only, remount it read-write (after checking it) and try again") from None
    print(f"removed {removed} entries from {cache.root}")
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "clear":
        return _clear(settings)
    # Listing writes nothing: it works on a read-only state dir and never creates the cache.
    cache = ModelCache(settings.server.cache_dir, settings.selection.cache_max_bytes, writable=False)
    entries, broken = cache.entries(), cache.broken()
    total = sum(e.size for e in entries) + sum(b.size for b in broken)
    print(f"{cache.root}: {len(entries)} entries, {total} bytes (limit {cache.max_bytes})"
          + (f", {len(broken)} corrupt" if broken else ""))
    for entry in entries:
        d = entry.decision
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used)) if entry.last_used else "-"
        print(f"  {entry.key}  {d.get('model')}:{d.get('version')}  {d.get('chosen')}  {entry.size} B  used {used}")
    for broken_entry in broken:
        print(f"  {broken_entry.key}  corrupt: {broken_entry.reason}  {broken_entry.size} B")
    if broken:
        print("corrupt entries are never used (a model with one is measured again); "
              "`appliance cache clear` removes them")
    return 0
