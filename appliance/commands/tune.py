"""``appliance tune MODEL``: measure every plan for a model now (ignoring the cache) and store the choice."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from typing import Any

from appliance.core.errors import ConfigError
from appliance.repository.loader import load_model
from appliance.selection.report import format_selection
from appliance.settings import Settings

__all__ = ["add_parser", "progress_line", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("tune", help="measure which plan runs MODEL fastest here and cache the choice")
    parser.add_argument("model", help="model name in the repository")
    parser.add_argument("--model-repository", type=str, help="model repository (default: the example one)")
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir (holds the model cache)")


_BAR = 20


def progress_line(message: str, step: int, steps: int, width: int) -> str:
    """One frame of the progress bar, never wider than ``width`` columns (a long message is cut)."""
    step = min(max(step, 0), steps)
    filled = _BAR * step // max(steps, 1)
    head = f"[{'#' * filled}{'.' * (_BAR - filled)}] {step}/{steps} "
    room = max(width - 1 - len(head), 0)  # the last column left free: some terminals wrap on it
    text = message if len(message) <= room else (message[:room - 1] + "…" if room else "")
    return head + text.ljust(room)


def _progress_bar(message: str, step: int, steps: int) -> None:
    sys.stderr.write("\r" + progress_line(message, step, steps, shutil.get_terminal_size().columns))
    if message.startswith("chose"):
        sys.stderr.write("\n")
    sys.stderr.flush()


def run(args: argparse.Namespace, settings: Settings) -> int:
    import hardware_probe
    from appliance.composition import make_selector, probe_cache_file, resolve_repository, runtime_options
    from appliance.runtime.state import StateDir

    # The daemon's probe (a child process, the same bound per step, the report it keeps): a fingerprint
    # computed otherwise could differ, and the decision cached here would be one the daemon never reads.
    sys.stderr.write(f"probing this box (at most {hardware_probe.DEFAULT_TIMEOUT:.0f} s)\n")
    kept = probe_cache_file(settings.server, StateDir.check(settings.server.state_dir))
    report, _ = hardware_probe.probe_cached(kept)
    selector = make_selector(settings.selection, settings.server, report)
    if selector is None:
        raise ConfigError("selection is switched off in the settings (selection = false)")
    selector.progress = _progress_bar
    model_dir = resolve_repository(settings.server) / args.model
    if not model_dir.is_dir():
        raise ConfigError(f"no model {args.model!r} in {model_dir.parent}")
    loaded = load_model(model_dir, runtime_options(settings.models), selector, retune=True)
    for _, model in sorted(loaded.versions.items()):
        print(format_selection(model.selection or {}))
        asyncio.run(model.close())
    for version, reason in sorted(loaded.failures.items()):
        print(f"version {version} failed: {reason}")
    return 0 if not loaded.failures else 1
