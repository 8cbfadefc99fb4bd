"""Which boxes a fleet command talks to (found over mDNS, or named by URL), and a small HTTP helper."""

from __future__ import annotations

import argparse
import http.client
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.client.boxes import Box, discover
from appliance.errors import ConfigError
from appliance.settings import Settings

__all__ = ["add_target_options", "fetch_json", "read_token", "select_boxes"]


def add_target_options(parser: argparse.ArgumentParser, choose: bool) -> None:
    """``choose``: the command acts on some boxes (--to / --all), not merely on every one it finds."""
    if choose:
        parser.add_argument("--to", dest="to", action="append", metavar="NAME", default=[],
                            help="a box's name as `appliance discover` lists it (repeatable)")
        parser.add_argument("--all", action="store_true", help="every box found on the LAN")
    parser.add_argument("--url", dest="urls", action="append", metavar="URL", default=[],
                        help="a box by address, such as http://192.168.1.20:8000 (repeatable; no mDNS needed)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to listen for boxes (default 3)")
    parser.add_argument("--mdns-interface", dest="discover_interfaces", action="append", metavar="ADDR",
                        help="listen only on the interface with this IPv4 address (repeatable)")


def select_boxes(args: argparse.Namespace, choose: bool) -> list[Box]:
    """The boxes the arguments name; ConfigError saying what is wrong otherwise."""
    try:
        explicit = [Box.at(url) for url in args.urls]
    except ValueError as exc:
        raise ConfigError(f"--url: {exc}") from None
    if choose:
        names: list[str] = args.to
        if names and args.all:
            raise ConfigError("give either --to NAME (repeatable) or --all, not both")
        if not (names or args.all or explicit):
            raise ConfigError("say which boxes: --to NAME (repeatable), --all (every box on the LAN) or --url URL")
        if not (names or args.all):
            return explicit
    else:  # every box found, unless boxes are named by URL
        if explicit:
            return explicit
        names = []
    found = discover(args.timeout, args.discover_interfaces or ())
    if names:
        by_name = {box.name: box for box in found}
        missing = [name for name in names if name not in by_name]
        if missing:
            seen = ", ".join(sorted(by_name)) or "none"
            raise ConfigError(f"no box named {', '.join(missing)} answered within {args.timeout:g} s (found: {seen}); "
                              "check `appliance discover`, or raise --timeout")
        return explicit + [by_name[name] for name in names]
    if not found and not explicit and choose:
        raise ConfigError(f"no box answered on the LAN within {args.timeout:g} s; check `appliance discover`, "
                          "raise --timeout, or name boxes with --url")
    return explicit + found


def read_token(path: Path | None, settings: Settings) -> str | None:
    """The bearer token: from --token-file, else the auth_token setting (APPLIANCE_AUTH_TOKEN), else
    none (enough for a box that exempts this client's address, such as its own host)."""
    if path is None:
        return settings.auth.token
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: {exc.strerror or exc}") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty; copy the box's <state_dir>/auth-token")
    return token


def fetch_json(box: Box, method: str, path: str, body: bytes | None = None, token: str | None = None,
               timeout: float = 10.0, headers: Sequence[tuple[str, str]] = ()) -> tuple[int, Any]:
    """(status, JSON answer or None) of one request to a box; OSError when it cannot be reached."""
    connection = http.client.HTTPConnection(box.addresses[0], box.port, timeout=timeout)
    try:
        sent = dict(headers)
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        if token:
            sent["Authorization"] = f"Bearer {token}"
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        raw = response.read()
    except http.client.HTTPException as exc:
        raise OSError(f"bad answer: {exc}") from None
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw) if raw else None
    except ValueError:
        return response.status, raw[:300].decode("utf-8", "replace")
