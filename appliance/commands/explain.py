"""``appliance explain MODEL``: the running daemon's plan decision for a model, as a table."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from appliance.core.errors import ConfigError
from appliance.selection.report import format_selection
from appliance.settings import Settings

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("explain", help="show which plan serves MODEL and how the candidates measured")
    parser.add_argument("model")
    parser.add_argument("--version", default=None)
    parser.add_argument("--url", default=None, help="daemon base URL (default http://127.0.0.1:<http_port>)")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, settings: Settings) -> int:
    base = args.url or f"http://127.0.0.1:{settings.http.port}"
    path = f"/v2/models/{args.model}" + (f"/versions/{args.version}" if args.version else "") + "/selection"
    try:
        with urllib.request.urlopen(base.rstrip("/") + path, timeout=10) as response:
            decision = json.load(response)
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"{base}: {json.loads(exc.read() or b'{}').get('error', exc.reason)}") from None
    except OSError as exc:
        raise ConfigError(f"cannot reach the daemon at {base} ({exc}); is it running? pass --url") from None
    print(json.dumps(decision, indent=2) if args.json else format_selection(decision))
    return 0
