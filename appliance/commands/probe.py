"""``appliance probe [--json]``: what this box has."""

from __future__ import annotations

import argparse
import json
from typing import Any

from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("probe", help="report CPU, memory, accelerators and runtimes of this box")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds each probe step may take")


def run(args: argparse.Namespace, settings: Settings) -> int:
    import hardware_probe

    report = hardware_probe.probe(timeout=args.timeout)
    print(json.dumps(report.to_json(), indent=2, default=str) if args.json else report.table())
    return 0
