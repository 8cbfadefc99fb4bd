"""``appliance fleet``: every box on the LAN at a glance, from each box's own API; and the boxes the
operator trusts (``appliance fleet trust|untrust|trusted``).

Per box: name, address, hardware (its probe's summary), models ready/total (repository index),
requests/s and p50 latency over the last minute (history API: per-second rows; the p50 is the median
of the per-second medians, weighted by their requests), version and whether it is pinned. What needs no
token is read without one; a box that protects its API (protect_inference) is read with signed
requests if it is pinned (the token is never sent), and not at all otherwise.

``appliance fleet trust NAME`` pins a box found on the LAN: its id (from its record, confirmed by the box
at its address) and that address, and when its HTTP port speaks TLS the fingerprint of the certificate it
presents; ``--url URL`` pins a box by address (the number its host resolves to and the box answered
at, never a name); ``--id ID`` pins only if the box is that box (read the id
on the box: ``<state_dir>/device-id``), ``--fingerprint FP`` only if it presents that certificate (read
it on the box: ``appliance tls show``). ``untrust NAME`` forgets a pin; ``trusted`` lists them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import textwrap
import time
from pathlib import Path
from typing import Any

from appliance.client.boxes import discover
from appliance.client.trust import TrustStore, same_fingerprint
from appliance.commands.targets import (
    BoxClient,
    CertificateChanged,
    Refusal,
    Target,
    add_target_options,
    choose_targets,
    explicit_boxes,
    prove_identity,
    resolve,
    trust_store,
)
from appliance.core.errors import ConfigError
from appliance.settings import Settings

__all__ = ["add_parser", "box_summary", "minute_load", "run"]

WINDOW = 60


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("fleet", help="one table of every box on the LAN: hardware, models, load, version; "
                                          "`fleet trust NAME` pins a box")
    add_target_options(parser, choose=False)
    parser.add_argument("--token-file", type=Path,
                        help="the boxes' token, to read boxes that protect their API (signs, never sent)")
    parser.add_argument("--json", action="store_true")
    actions = parser.add_subparsers(dest="fleet_action", metavar="{trust,untrust,trusted}")
    trust = actions.add_parser("trust", help="pin boxes (by id and address): the only ones push acts on")
    trust.add_argument("names", nargs="*", metavar="NAME", help="a box's name as `appliance discover` lists it")
    trust.add_argument("--all", action="store_true", help="every box found on the LAN now")
    trust.add_argument("--id", dest="expect_id", metavar="ID",
                       help="pin only if the box is this box id (its <state_dir>/device-id)")
    trust.add_argument("--fingerprint", dest="expect_fingerprint", metavar="SHA256",
                       help="pin only if the box presents this TLS certificate (`appliance tls show` on the box)")
    add_target_options(trust, choose=False)
    untrust = actions.add_parser("untrust", help="forget pinned boxes")
    untrust.add_argument("names", nargs="+", metavar="NAME", help="a pinned box's name (or id)")
    trusted = actions.add_parser("trusted", help="list the pinned boxes")
    trusted.add_argument("--json", action="store_true")


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


class _Reader:
    """Reads one box: plainly first; signed (the token never sent) when the box answers 401, it is
    trusted and a token was given."""

    def __init__(self, client: BoxClient, target: Target, token: str | None, store: TrustStore) -> None:
        self._client = client
        self._target = target
        self._token = token
        self._store = store
        self._proven: tuple[str, str] | None = None
        """(box id, an unused nonce) the box answered when checked."""
        self.refused: str | None = None

    def check(self) -> None:
        """A box named by URL at an address where no box is pinned says its id first: one that says it is
        a pinned box it cannot prove it is (TrustStore.named_verdict) is refused before it is read."""
        if not self._target.named or self._target.trust.pin is not None:
            return
        try:
            self._proven = prove_identity(self._client, self._target, self._store)
        except Refusal as exc:
            self.refused = str(exc)
        except OSError:
            self._client.close()  # not an appliance that signs (its nonce answer is odd): its reads will say

    def get(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        status, answer = self._client.call(method, path, body)
        if status != 401 or not self._token or not self._target.trust.trusted or self.refused:
            return status, answer
        identity, self._proven = self._proven, None
        try:
            identity = identity or prove_identity(self._client, self._target, self._store)
        except Refusal as exc:
            self.refused = str(exc)
            return status, answer
        if identity is None:
            return status, answer
        return self._client.signed(self._token, *identity, method, path, body)


def box_summary(target: Target, token: str | None, store: TrustStore) -> dict[str, Any]:
    """What `appliance fleet` shows of one box; ``error`` says why parts are missing."""
    box = target.box
    trust = target.trust
    row: dict[str, Any] = {"name": box.name, "address": target.reachable_box.url, "url": target.reachable_box.base_url,
                           "id": box.id or None, "hw": box.hw or None, "models_ready": None, "models_total": None,
                           "requests_per_s": None, "p50_ms": None, "version": box.version or None,
                           "trusted": trust.trusted, "trust": _trust_word(target), "error": None}
    problems: list[str] = []
    with BoxClient(target.reachable_box, fingerprint=target.fingerprint, again=target.again) as client:
        reader = _Reader(client, target, token, store)
        try:
            reader.check()
            if not reader.refused:
                _read(reader, row, problems, target)
        except OSError as exc:
            problems.append(f"unreachable: {exc}")
        except CertificateChanged as exc:
            reader.refused = str(exc)
        if client.address:
            row["address"], row["url"] = client.reached.url, client.reached.base_url
    if reader.refused:
        row["trusted"], row["trust"] = False, "CHANGED"
        problems.append(reader.refused)
    elif trust.changed:
        problems.append(trust.reason)
    row["error"] = "; ".join(problems) or None
    return row


def _read(reader: _Reader, row: dict[str, Any], problems: list[str], target: Target) -> None:
    locked = (f"protects its API (protect_inference): pin it to read it: {target.again}" if not target.trust.trusted
              else "protects its API: give the token (--token-file) to read it")
    status, metadata = reader.get("GET", "/v2")
    if status == 200 and isinstance(metadata, dict):
        row["version"] = metadata.get("version") or row["version"]
    status, index = reader.get("POST", "/v2/repository/index", b"{}")
    if status == 200 and isinstance(index, list):
        rows = [r for r in index if isinstance(r, dict)]
        row["models_ready"] = len({r.get("name") for r in rows if r.get("state") == "READY"})
        row["models_total"] = len({r.get("name") for r in rows})
    else:
        problems.append(f"repository index: HTTP {status}" + (f" ({locked})" if status == 401 else ""))
    status, probe = reader.get("GET", "/v2/probe")
    if status == 200 and isinstance(probe, dict) and probe.get("summary"):
        row["hw"] = probe["summary"]
    until = int(time.time())
    status, history = reader.get("GET", f"/v2/history?since={until - WINDOW}&until={until}&step=1")
    if status == 200:
        row["requests_per_s"], row["p50_ms"] = minute_load(history)
    else:
        problems.append(f"history: HTTP {status}")


def _trust_word(target: Target) -> str:
    if target.trust.trusted:
        return "pinned" if target.trust.pin is not None else "url"
    return "CHANGED" if target.trust.changed else "no"


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _list(args: argparse.Namespace, settings: Settings) -> int:
    chosen, store, token = choose_targets(args, settings, choose=False)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(chosen)))) as pool:
        rows = list(pool.map(lambda target: box_summary(target, token, store), chosen))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no appliances found")
        return 0
    table = [("name", "address", "hardware", "models", "req/s", "p50 ms", "version", "trusted")]
    for row in rows:
        models = "-" if row["models_total"] is None else f"{row['models_ready']}/{row['models_total']}"
        hardware = (row["hw"] or "-").split("; runtimes")[0]  # the whole summary is in --json
        hardware = textwrap.shorten(hardware, 70, placeholder=" ...")  # whole words: never half a number
        table.append((row["name"], row["address"], hardware, models, _cell(row["requests_per_s"]),
                      _cell(row["p50_ms"]), _cell(row["version"]), row["trust"]))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    for row in rows:
        if row["error"]:
            print(f"{row['name']}: {row['error']}")
    unpinned = [row["name"] for row in rows if row["trust"] == "no"]
    if unpinned:
        print(f"not pinned (push refuses them): {', '.join(unpinned)}; check each is yours, then "
              "`appliance fleet trust NAME`")
    return 0


def _trust(args: argparse.Namespace, settings: Settings) -> int:
    store = trust_store(settings)
    explicit = explicit_boxes(args)
    if not (args.names or args.all or explicit):
        raise ConfigError("say which boxes to pin: NAME (repeatable, as `appliance discover` lists them), --all "
                          "(every box found now) or --url URL")
    if args.names and args.all:
        raise ConfigError("give either NAME (repeatable) or --all, not both")
    boxes = [resolve(box) for box in explicit]  # pinned at the number it answers at, never at a name
    if args.names or args.all:
        found = {box.name: box for box in discover(args.timeout, args.discover_interfaces or ())}
        missing = [name for name in args.names if name not in found]
        if missing:
            raise ConfigError(f"no box named {', '.join(missing)} answered within {args.timeout:g} s (found: "
                              f"{', '.join(sorted(found)) or 'none'}); check `appliance discover`, or raise --timeout")
        boxes += list(found.values()) if args.all else [found[name] for name in args.names]
        if not boxes:
            raise ConfigError(f"no box answered on the LAN within {args.timeout:g} s; check `appliance discover`")
    if (args.expect_id or args.expect_fingerprint) and len(boxes) != 1:
        raise ConfigError("--id and --fingerprint pin one box: name exactly one")
    problems = []
    for box in boxes:
        try:
            with BoxClient(box) as client:
                identity = client.identify()
                presented = client.presented
                reached = client.reached
        except OSError as exc:
            problems.append(f"{box.name}: cannot reach {box.base_url}: {exc}")
            continue
        answered = identity[0] if identity is not None else ""
        if not answered:
            problems.append(f"{box.name}: the box at {reached.url} proves no id (it answers no /v2/fleet/nonce: not "
                            "an appliance, or one too old to take signed requests); not pinned")
        elif box.id and answered != box.id:
            problems.append(f"{box.name}: its LAN record says box {box.id}, but the box at {reached.url} says it is "
                            f"box {answered}: something else answers there; not pinned")
        elif args.expect_id and answered != args.expect_id:
            problems.append(f"{box.name}: the box at {reached.url} is box {answered}, not {args.expect_id}; not pinned")
        elif args.expect_fingerprint and not same_fingerprint(args.expect_fingerprint, presented):
            problems.append(f"{box.name}: the box at {reached.url} presents the TLS certificate "
                            f"{presented or '(none: plain HTTP)'}, not {args.expect_fingerprint}; not pinned")
        else:
            pin = store.pin(reached, answered, presented)
            print(f"pinned {pin.name}: box {pin.id} at {pin.where}"
                  + (f", TLS certificate SHA-256 {pin.fingerprint}" if pin.fingerprint else ""))
    store.save()
    if not args.expect_id and len(problems) < len(boxes):
        print(f"check each id against the box's own <state_dir>/device-id (or pin with --id ID), and each TLS "
              f"certificate against `appliance tls show` there (or pin with --fingerprint); pins are kept in "
              f"{store.path}")
    for problem in problems:
        print(f"appliance fleet trust: {problem}")
    return 1 if problems else 0


def _untrust(args: argparse.Namespace, settings: Settings) -> int:
    store = trust_store(settings)
    status = 0
    for name in args.names:
        gone = store.unpin(name)
        if gone:
            print(f"forgot {', '.join(f'{p.name} (box {p.id} at {p.where})' for p in gone)}")
        else:
            print(f"appliance fleet untrust: no pinned box named {name}")
            status = 1
    store.save()
    return status


def _trusted(args: argparse.Namespace, settings: Settings) -> int:
    store = trust_store(settings)
    pins = store.pins()
    if args.json:
        print(json.dumps([{"name": p.name, "id": p.id, "address": p.where, "pinned_at": p.pinned_at,
                           "fingerprint": p.fingerprint or None} for p in pins], indent=2))
        return 0
    if not pins:
        print(f"no pinned boxes (in {store.path}); pin one with `appliance fleet trust NAME`")
        return 0
    table = [("name", "id", "address", "pinned at", "TLS certificate (SHA-256)")] + [
        (p.name, p.id, p.where, p.pinned_at, p.fingerprint or "- (plain HTTP)") for p in pins]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for line in table:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    action = {"trust": _trust, "untrust": _untrust, "trusted": _trusted}.get(args.fleet_action or "", _list)
    return action(args, settings)
