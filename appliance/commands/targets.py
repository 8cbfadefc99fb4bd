"""Which boxes a fleet command talks to (found over mDNS, or named by URL), whether each is trusted, and
HTTP to one box: plain, or signed with the token (which never leaves this machine).

A box found on the LAN is trusted only when the operator pinned it (``appliance fleet trust``: its id
at its address, see appliance.client.trust); a box named with ``--url`` is trusted for the command that
names it, unless another box was pinned at that address, or it says it is a pinned box and cannot prove
it. A URL's host is resolved once, here, and the box is talked to at the number resolved: a URL whose
host resolves to a pinned box's address (``https://localhost:8000`` for a box pinned at 127.0.0.1:8000)
names that pinned box, and gets its checks (its id, its certificate, TLS). Whatever a box is, the token
is never sent: requests that need it are signed (appliance.security.fleet_signature) for the box id the
client expects, with a nonce that box issued.

A box whose HTTP port speaks TLS (its record's ``tls``, an ``https://`` URL, or a pin with a certificate
fingerprint) is talked to over TLS. Its certificate is checked against the pin's fingerprint, not against
a CA (a box's own certificate is self-signed): another certificate is refused before anything is sent.
A box not pinned yet is taken with whatever certificate it presents, which ``fleet trust`` then records.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.client.boxes import Box, discover, numeric_addresses
from appliance.client.trust import Trust, TrustStore, certificate_fingerprint, same_fingerprint
from appliance.core.errors import ConfigError
from appliance.security.fleet_signature import NONCE_PATH, sign
from appliance.settings import Settings

__all__ = ["BoxClient", "CertificateChanged", "Refusal", "Target", "add_target_options", "choose_targets",
           "explicit_boxes", "prove_identity", "read_token", "resolve", "select_boxes", "targets", "trust_store"]


def add_target_options(parser: argparse.ArgumentParser, choose: bool) -> None:
    """``choose``: the command acts on some boxes (--to / --all), not merely on every one it finds."""
    if choose:
        parser.add_argument("--to", dest="to", action="append", metavar="NAME", default=[],
                            help="a box's name as `appliance discover` lists it (repeatable)")
        parser.add_argument("--all", action="store_true", help="every box found on the LAN")
    parser.add_argument("--url", dest="urls", action="append", metavar="URL", default=[],
                        help="a box by address, such as http://192.168.1.20:8000, or https://... for TLS "
                             "(repeatable; no mDNS needed)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to listen for boxes (default 3)")
    parser.add_argument("--mdns-interface", dest="discover_interfaces", action="append", metavar="ADDR",
                        help="listen only on the interface with this IPv4 address (repeatable)")


def explicit_boxes(args: argparse.Namespace) -> list[Box]:
    try:
        return [Box.at(url) for url in args.urls]
    except ValueError as exc:
        raise ConfigError(f"--url: {exc}") from None


def select_boxes(args: argparse.Namespace, choose: bool) -> list[Box]:
    """The boxes the arguments name; ConfigError saying what is wrong otherwise."""
    explicit = explicit_boxes(args)
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


def trust_store(settings: Settings) -> TrustStore:
    return TrustStore.load(settings.fleet.trusted_boxes_file(settings.server.state_dir))


def resolve(box: Box) -> Box:
    """A box named by URL, at the numeric addresses its host resolves to (ConfigError when none): the
    ones it is checked at and talked to, so that a second lookup cannot point elsewhere."""
    addresses = numeric_addresses(box.addresses[0], box.port)
    if not addresses:
        raise ConfigError(f"--url {box.base_url}: {box.addresses[0]} resolves to no address; check the name, or "
                          "give the box's address (such as http://192.168.1.20:8000)")
    return dataclasses.replace(box, addresses=addresses)


@dataclasses.dataclass(frozen=True)
class Target:
    """A box a command acts on. ``trust`` for a box found on the LAN, or named by URL at a pinned
    address, is decided from the pins alone, before any contact; for another box named by URL once it
    has said its id (``prove_identity``)."""

    box: Box
    named: bool
    """Named with --url (not found on the LAN)."""
    trust: Trust
    fingerprint: str = ""
    """The certificate the box must present (its pin's), '' when none is pinned."""
    given: str = ""
    """The URL as given (--url; https:// for a box pinned with TLS), '' for a box found on the LAN."""

    @property
    def reachable_box(self) -> Box:
        """The box at the address to use: a pinned box at its pinned address."""
        return self.trust.box or self.box

    @property
    def again(self) -> str:
        """The command that pins this box (again), as the operator named it."""
        return f"appliance fleet trust --url {self.given}" if self.given else f"appliance fleet trust {self.box.name}"


def targets(boxes: Sequence[Box], named: Sequence[Box], store: TrustStore) -> list[Target]:
    """``named``: the boxes given by --url (trusted for this command once they say their id, or, at a
    pinned box's address, once they prove they are that box)."""
    given = set(named)
    chosen = []
    for box in boxes:
        if box in given:
            chosen.append(_named(box, store))
        else:
            verdict = store.verdict(box)
            pinned = verdict.pin.fingerprint if verdict.trusted and verdict.pin is not None else ""
            chosen.append(Target(box, False, verdict, pinned))
    return chosen


def _named(box: Box, store: TrustStore) -> Target:
    url = box.base_url
    placed = resolve(box)
    pin = store.pinned_at(placed)
    if pin is None:
        return Target(placed, True, Trust(True, box=placed), given=url)
    # Whatever name the URL used, this is the address of a pinned box: that box, at that number, with the
    # pin's checks; pinned with TLS, it is never talked to in plain text again (an http:// URL included).
    tls = tuple(dict.fromkeys(("http", *placed.tls))) if pin.fingerprint else placed.tls
    pinned = dataclasses.replace(placed, addresses=(pin.address,), tls=tls)
    given = f"https://{box.name}" if pin.fingerprint else url  # box.name: the URL's host:port
    return Target(pinned, True, Trust(True, pin=pin, box=pinned), pin.fingerprint, given=given)


def choose_targets(args: argparse.Namespace, settings: Settings,
                   choose: bool) -> tuple[list[Target], TrustStore, str | None]:
    """What a fleet command acts with: the boxes the arguments name (``choose``: the command needs --to,
    --all or --url; otherwise every box found) with their trust, the pins that decided it, and the token
    to sign requests with."""
    token = read_token(args.token_file, settings)
    store = trust_store(settings)
    return targets(select_boxes(args, choose=choose), explicit_boxes(args), store), store, token


def read_token(path: Path | None, settings: Settings) -> str | None:
    """The token: from --token-file, else the auth_token setting (APPLIANCE_AUTH_TOKEN), else none
    (enough for a box that exempts this client's address, such as its own host). It is only ever used
    to sign requests; it is not sent."""
    if path is None:
        return settings.auth.token
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: {exc.strerror or exc}") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty; copy the box's <state_dir>/auth-token")
    return token


class Refusal(Exception):
    """The command will not send this request to this box (it is not the box it was pinned as...)."""


class CertificateChanged(Refusal):
    """The box presented a certificate other than the one it was pinned with."""


class BoxClient:
    """HTTP to one box, over one keep-alive connection: ``call`` sends a request as is; ``signed`` proves
    the token with a signature over a fresh nonce of the box, for the box id expected. Over TLS when the
    box's HTTP port speaks it; ``fingerprint``: the certificate it must present (CertificateChanged
    otherwise, before any request is sent). The box's addresses are tried in order (numbers: a name in
    them would be looked up again by the connection); ``again``: the command that pins the box, for the
    messages (default: by its name)."""

    def __init__(self, box: Box, timeout: float = 10.0, fingerprint: str = "", again: str = "") -> None:
        self.box = box
        self._timeout = timeout
        self._fingerprint = fingerprint
        self._again = again or f"appliance fleet trust {box.name}"
        self._connection: http.client.HTTPConnection | None = None
        self.presented: str = ""
        """The fingerprint of the certificate the box presented ('' until a TLS connection is made)."""
        self.address: str = ""
        """The address connected to ('' until a connection is made)."""

    @property
    def reached(self) -> Box:
        """The box at the address connected to (all its addresses until then)."""
        return dataclasses.replace(self.box, addresses=(self.address,)) if self.address else self.box

    def __enter__(self) -> BoxClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: Sequence[tuple[str, str]] = (), timeout: float | None = None) -> tuple[int, Any]:
        """(status, JSON answer or None); OSError when the box cannot be reached."""
        if self._connection is None:
            self._connection = self._connect()
        self._connection.timeout = timeout or self._timeout
        if self._connection.sock is not None:
            self._connection.sock.settimeout(self._connection.timeout)
        sent = dict(headers)
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        try:
            self._connection.request(method, path, body=body, headers=sent)
            response = self._connection.getresponse()
            raw = response.read()
        except http.client.HTTPException as exc:
            self.close()
            raise OSError(f"bad answer: {exc}") from None
        except OSError:
            self.close()
            raise
        if response.will_close:
            self.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw[:300].decode("utf-8", "replace")

    def _connect(self) -> http.client.HTTPConnection:
        failures = []
        for address in self.box.addresses:
            try:
                connection = self._open(address)
            except OSError as exc:
                failures.append(f"{address}: {exc}" if len(self.box.addresses) > 1 else str(exc))
                continue
            self.address = address
            return connection
        raise OSError("; ".join(failures) or "no address")

    def _open(self, host: str) -> http.client.HTTPConnection:
        port = self.box.port
        if "http" not in self.box.tls:
            plain = http.client.HTTPConnection(host, port, timeout=self._timeout)
            plain.connect()
            return plain
        # No CA check: a box's own certificate is self-signed; the pin's fingerprint is what is checked.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection(host, port, timeout=self._timeout, context=context)
        try:
            connection.connect()
        except ssl.SSLError as exc:
            connection.close()
            raise OSError(f"TLS handshake with {self.box.base_url} failed: {exc.reason or exc}") from None
        connection.auto_open = 0  # http.client reconnecting on its own would skip the certificate's check
        assert isinstance(connection.sock, ssl.SSLSocket)
        der = connection.sock.getpeercert(binary_form=True) or b""
        self.presented = certificate_fingerprint(der)
        if self._fingerprint and not same_fingerprint(self._fingerprint, self.presented):
            connection.close()
            raise CertificateChanged(
                f"{self.box.name} at {self.box.url} presents the TLS certificate {self.presented}, but it was pinned "
                f"with {self._fingerprint}: another box, or an impostor, is there; nothing was sent. If the box's "
                f"certificate was replaced on purpose (appliance tls init --force), check its fingerprint on the box "
                f"(appliance tls show) and pin it again: {self._again}")
        return connection

    def identify(self) -> tuple[str, str] | None:
        """(box id, a nonce) as the box answers them; None when it does not sign (Triton, an older
        appliance)."""
        status, answer = self.call("GET", NONCE_PATH)
        if status == 404:
            return None
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("id"), str) \
                or not isinstance(answer.get("nonce"), str):
            raise OSError(f"{NONCE_PATH} answered HTTP {status}: {str(answer)[:200]}")
        return answer["id"], answer["nonce"]

    def expect(self, box_id: str, where: str) -> str:
        """A nonce of this box, once it has said it is ``box_id``; Refusal otherwise (``where``: the
        pin's description)."""
        identity = self.identify()
        if identity is None:
            raise Refusal(f"{self.box.name} at {self.box.url} does not prove its identity (it answers no "
                          f"{NONCE_PATH}: not an appliance, or one too old to take signed requests), so it is not "
                          f"sent anything; it was pinned as box {box_id} {where}")
        answered, nonce = identity
        if answered != box_id:
            raise Refusal(f"the box at {self.box.url} now says it is box {answered}, but {self.box.name} was pinned "
                          f"as box {box_id} {where}: another box, or an impostor, is there; if you replaced the "
                          f"box, check it and pin it again: {self._again}")
        return nonce

    def signed(self, token: str, box_id: str, nonce: str, method: str, path: str, body: bytes | None = None,
               timeout: float | None = None) -> tuple[int, Any]:
        """The request with ``Authorization: Fleet ...`` over ``nonce`` (one request per nonce)."""
        header = sign(token, box_id, nonce, method, path, body or b"")
        return self.call(method, path, body, [("Authorization", header)], timeout)


def prove_identity(client: BoxClient, target: Target, store: TrustStore) -> tuple[str, str] | None:
    """(box id, a nonce) of a trusted box once it has proved it is the box expected: a pinned box (found
    on the LAN, or named at its pinned address) must say the pin's id; another box named by URL must not
    say it is a pinned box it cannot prove it is (TrustStore.named_verdict). None for a box named by URL
    that does not sign (Triton); Refusal otherwise."""
    pin = target.trust.pin
    if pin is not None:
        return pin.id, client.expect(pin.id, f"at {pin.where}")
    answered = client.identify()
    if answered is not None:
        verdict = store.named_verdict(client.reached, answered[0], client.presented, target.again)
        if not verdict.trusted:
            raise Refusal(verdict.reason)
    return answered
