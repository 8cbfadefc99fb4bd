"""``appliance discover``: list the appliances on the LAN."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from appliance.client import discover
from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("discover", help="list the appliances announcing themselves on the LAN")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to listen (default 3)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mdns-interface", dest="discover_interfaces", action="append", metavar="ADDR",
                        help="listen only on the interface with this IPv4 address (repeatable)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    boxes = discover(args.timeout, args.discover_interfaces or ())
    if args.json:
        print(json.dumps([{**dataclasses.asdict(b), "url": b.base_url, "grpc_url": b.grpc_url} for b in boxes],
                         indent=2))
        return 0
    if not boxes:
        print("no appliances found")
        return 0
    rows = [("name", "addresses", "port", "grpc", "tls", "hw", "models", "version")]
    rows += [(b.name, ",".join(b.addresses), str(b.port), str(b.grpc_port or "-"), ",".join(b.tls) or "-", b.hw,
              str(b.models), b.version) for b in boxes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0
