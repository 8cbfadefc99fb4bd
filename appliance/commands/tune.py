"""``appliance tune MODEL``: measure every plan for a model now (ignoring the cache) and store the choice."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from appliance.core.errors import ConfigError
from appliance.repository.loader import load_model
from appliance.selection.report import format_selection
from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("tune", help="measure which plan runs MODEL fastest here and cache the choice")
    parser.add_argument("model", help="model name in the repository")
    parser.add_argument("--model-repository", type=str, help="model repository (default: the example one)")
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir (holds the model cache)")


def _progress_bar(message: str, step: int, steps: int) -> None:
    filled = int(20 * step / max(steps, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (20 - filled)}] {step}/{steps} {message:<50}")
    if message.startswith("chose"):
        sys.stderr.write("\n")
    sys.stderr.flush()


def run(args: argparse.Namespace, settings: Settings) -> int:
    import hardware_probe
    from appliance.composition import make_selector, resolve_repository, runtime_options

    report = hardware_probe.probe()
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
