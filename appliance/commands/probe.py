"""``appliance probe [--json]``: what this box has."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("probe", help="report CPU, memory, accelerators and runtimes of this box")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=float, help="seconds each probe step may take (default: the daemon's, "
                                                        "so that the fingerprint is the one it computes)")


def _step_ended(name: str, ended: int, steps: int) -> None:
    sys.stderr.write(f"probed {name} ({ended}/{steps})\n")
    sys.stderr.flush()


def run(args: argparse.Namespace, settings: Settings) -> int:
    import hardware_probe

    timeout = hardware_probe.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    sys.stderr.write(f"probing CPU, memory, accelerators and runtimes (importing each runtime takes seconds; "
                     f"at most {timeout:.0f} s)\n")
    report = hardware_probe.probe(timeout=timeout, progress=_step_ended)
    print(json.dumps(report.to_json(), indent=2, default=str) if args.json else report.table())
    return 0
