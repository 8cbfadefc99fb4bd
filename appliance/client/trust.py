"""The boxes a client trusts: pinned by the operator, by box id and address. A box found on the LAN is
only a claim (anyone can announce ``_kserve-v2._tcp`` with any name and id), so nothing secret goes to
a box merely found there.

``appliance fleet trust NAME`` pins a box (its id, as it answers at its address); ``appliance push``
refuses a box that is not pinned, and signs what it sends to a pinned one (appliance.security.fleet_signature:
the token itself never travels); ``BoxPool(token=..., trusted_boxes=...)`` sends its bearer token only to
pinned boxes, at their pinned address. A pinned box that turns up at another address, or another box
(another id) under its name or at its address, is not trusted until the operator pins it again.

A box that serves HTTP over TLS is pinned with its certificate too (the SHA-256 fingerprint of the one
it presented when pinned): a box's certificate is usually self-signed (``appliance tls init``), so no CA
vouches for it and the pin is what does. A pinned box that presents another certificate, or that was
pinned with TLS and now announces plain HTTP, is refused until the operator pins it again.

An address is a number, never the text a command was given: a pin holds the numeric address the box
answered at, and a box named by URL (``localhost``, ``aisle-3.lan``, ``127.0.0.1``) is at a pinned
address when its name resolves to it, and is then that pinned box, with its checks. A box named by URL
that says it is a pinned box must prove it the way the pin can: with the pinned certificate over TLS,
or, for a box pinned over plain HTTP, by answering at its pinned address.

The pins are a small JSON file (the ``trusted_boxes`` setting; default ``<state_dir>/trusted-boxes.json``),
written whole (a temporary file renamed over it), mode 0600.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import platformdirs

from appliance.client.boxes import Box, host_port, numeric_addresses
from appliance.core.errors import ConfigError

__all__ = ["FILE_NAME", "Pin", "TokenPolicy", "Trust", "TrustStore", "certificate_fingerprint", "default_path",
           "same_fingerprint"]

FILE_NAME = "trusted-boxes.json"


def certificate_fingerprint(der: bytes) -> str:
    """SHA-256 of a certificate's DER bytes as colon-separated hex pairs, as ``appliance tls show`` and
    ``openssl x509 -fingerprint -sha256`` print it."""
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def same_fingerprint(one: str, other: str) -> bool:
    """Whether two spellings of a fingerprint (any case, with or without colons) are the same one."""
    def bare(text: str) -> str:
        return text.replace(":", "").strip().lower()

    return bool(bare(one)) and bare(one) == bare(other)


def default_path() -> Path:
    """The pins the CLI uses when no state dir or ``trusted_boxes`` setting says otherwise."""
    return Path(platformdirs.user_data_dir("appliance")) / FILE_NAME


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str
    id: str
    address: str
    port: int
    pinned_at: str = ""
    fingerprint: str = ""
    """The SHA-256 fingerprint of the certificate its HTTP port presented when pinned ('': plain HTTP)."""

    @property
    def where(self) -> str:
        return host_port(self.address, self.port)


@dataclasses.dataclass(frozen=True)
class Trust:
    trusted: bool
    reason: str = ""
    """Why not, with the command that fixes it ('' when trusted)."""
    pin: Pin | None = None
    changed: bool = False
    """A pinned box moved, or another box took a pinned one's name or address (not merely unknown)."""
    box: Box | None = None
    """The box to talk to, at its pinned address (when trusted)."""


def _trust_again(name: str) -> str:
    return f"appliance fleet trust {name}"



class TrustStore:
    """The pins in one file; ``load`` reads it (a missing file holds none), ``save`` writes it whole."""

    def __init__(self, path: Path, pins: Iterable[Pin] = ()) -> None:
        self.path = path
        self._pins = list(pins)

    @classmethod
    def load(cls, path: Path | str | None = None) -> TrustStore:
        path = Path(path) if path is not None else default_path()
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the pinned boxes in {path} ({exc}); fix or delete the file and pin "
                              "the boxes again (appliance fleet trust NAME)") from None
        try:
            pins = [Pin(str(p["name"]), str(p["id"]), str(p["address"]), int(p["port"]), str(p.get("pinned_at", "")),
                        str(p.get("fingerprint", ""))) for p in document["boxes"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path} is not a file of pinned boxes ({type(exc).__name__}: {exc}); delete it and "
                              "pin the boxes again (appliance fleet trust NAME)") from None
        return cls(path, pins)

    def pins(self) -> list[Pin]:
        return list(self._pins)

    def pin(self, box: Box, box_id: str, fingerprint: str = "") -> Pin:
        """Trust ``box`` as the box ``box_id`` at its first address (``fingerprint``: of the certificate
        it presented there, over TLS); a pin of the same name, id or address is replaced. Call ``save`` to
        keep it."""
        if not box_id:
            raise ConfigError(f"{box.name} at {box.url} says no box id: it is not an appliance (or one too old to "
                              "sign requests); nothing is pinned")
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
        made = Pin(box.name, box_id, box.addresses[0], box.port, now, fingerprint)
        self._pins = [p for p in self._pins if p.name != made.name and p.id != made.id and p.where != made.where]
        self._pins.append(made)
        return made

    def unpin(self, name: str) -> list[Pin]:
        """Forget the pins of this name (or box id); the ones removed."""
        gone = [p for p in self._pins if name in (p.name, p.id)]
        self._pins = [p for p in self._pins if p not in gone]
        return gone

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {"version": 1, "boxes": [dataclasses.asdict(p) for p in self._pins]}
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(document, handle, indent=2)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def verdict(self, box: Box) -> Trust:
        """Whether a box found on the LAN (its record's name, id and addresses) is one the operator pinned."""
        where = f"{box.addresses[0]}:{box.port}"
        for pin in self._pins:
            if box.id and pin.id == box.id and pin.address in box.addresses and pin.port == box.port:
                if pin.fingerprint and "http" not in box.tls:
                    return Trust(False, f"{box.name} (box {box.id}) was pinned serving TLS (certificate "
                                        f"{pin.fingerprint}), but now announces plain HTTP: check it, and if its "
                                        f"TLS was turned off on purpose pin it again: {_trust_again(box.name)}",
                                 pin, changed=True)
                return Trust(True, pin=pin, box=dataclasses.replace(box, addresses=(pin.address,)))
        same_id = next((p for p in self._pins if box.id and p.id == box.id), None)
        if same_id is not None:
            return Trust(False, f"{box.name} (box {box.id}) now answers at {where}, not at {same_id.where} where it "
                                f"was pinned: if it moved, check it and pin it again: {_trust_again(box.name)}",
                         same_id, changed=True)
        same_name = next((p for p in self._pins if p.name == box.name), None)
        if same_name is not None:
            return Trust(False, f"{box.name} now says it is box {box.id or '(no id)'}, but it was pinned as box "
                                f"{same_name.id}: another box, or an impostor, took its name; if you replaced the "
                                f"box, check it and pin it again: {_trust_again(box.name)}", same_name, changed=True)
        same_place = next((p for p in self._pins if p.address in box.addresses and p.port == box.port), None)
        if same_place is not None:
            return Trust(False, f"the box at {same_place.where} now says it is {box.name} (box {box.id or '(no id)'}), "
                                f"but {same_place.name} (box {same_place.id}) was pinned there: check it, then pin it: "
                                f"{_trust_again(box.name)}", same_place, changed=True)
        return Trust(False, f"{box.name} ({where}) was found on the LAN but is not pinned, and a box merely found "
                            f"there is not trusted: check it is yours (`appliance discover`), then "
                            f"{_trust_again(box.name)}")

    def pinned_at(self, box: Box) -> Pin | None:
        """The pin at one of the box's addresses (names resolved: ``localhost`` is 127.0.0.1) and its
        port, with its address as the number matched; None when no box was pinned there."""
        places = [(pin, numeric_addresses(pin.address, pin.port)) for pin in self._pins if pin.port == box.port]
        for named in box.addresses:
            for address in numeric_addresses(named, box.port):
                for pin, numbers in places:
                    if address in numbers:
                        return dataclasses.replace(pin, address=address)
        return None

    def named_verdict(self, box: Box, box_id: str, presented: str = "", again: str = "") -> Trust:
        """A box the operator named by URL, which answered ``box_id`` at its address (``presented``: the
        fingerprint of the certificate it presented there, '' over plain HTTP): trusted for this command,
        unless another box was pinned at that address, or it says it is a pinned box and cannot prove it
        (another certificate, plain HTTP for a box pinned with TLS, another address for one pinned
        without). ``again``: the command that pins it (default: by its URL)."""
        again = again or f"appliance fleet trust --url {box.base_url}"
        here = f"{box.name} ({box.url})" if box.name != box.url else box.url
        placed = self.pinned_at(box)
        if placed is not None and placed.id != box_id:
            return Trust(False, f"the box at {placed.where} now says it is box {box_id or '(no id)'}, but "
                                f"{placed.name} (box {placed.id}) was pinned there: check it, then pin it again: "
                                f"{again}", placed, changed=True)
        claimed = next((p for p in self._pins if box_id and p.id == box_id), None)
        if claimed is None:
            return Trust(True, box=box)
        if claimed.fingerprint and not presented:
            return Trust(False, f"the box at {here} says it is {claimed.name} (box {box_id}), which was pinned "
                                f"serving TLS (certificate {claimed.fingerprint}), but it answers plain HTTP: "
                                f"another box, or an impostor; nothing was sent. If that box's TLS was turned off "
                                f"on purpose, check it and pin it again: {again}", claimed, changed=True)
        if claimed.fingerprint and not same_fingerprint(claimed.fingerprint, presented):
            return Trust(False, f"the box at {here} says it is {claimed.name} (box {box_id}), but presents the TLS "
                                f"certificate {presented}, not {claimed.fingerprint} that box was pinned with: "
                                f"another box, or an impostor; nothing was sent. If its certificate was replaced on "
                                f"purpose, check its fingerprint on the box (appliance tls show) and pin it again: "
                                f"{again}", claimed, changed=True)
        if not claimed.fingerprint and placed is None:
            return Trust(False, f"the box at {here} says it is {claimed.name} (box {box_id}), which was pinned at "
                                f"{claimed.where} over plain HTTP, where nothing but that address proves it: if it "
                                f"moved, check it and pin it again: {again}", claimed, changed=True)
        return Trust(True, pin=claimed, box=box)


class TokenPolicy:
    """Which boxes a pool sends its bearer token to: every box the app named itself (a fixed list), and
    of the boxes found on the LAN only those pinned in ``trusted`` (at their pinned address); never a box
    merely found."""

    def __init__(self, token: str | None, trusted: TrustStore | None, named: bool) -> None:
        self.token = token
        self._trusted = trusted
        self._named = named

    def route(self, box: Box) -> Box:
        """The box as the pool should reach it: a pinned one at its pinned address."""
        if self.token is None or self._named or self._trusted is None:
            return box
        trust = self._trusted.verdict(box)
        return trust.box if trust.trusted and trust.box is not None else box

    def token_for(self, box: Box) -> str | None:
        if self.token is None or self._named:
            return self.token
        if self._trusted is None:
            return None
        trust = self._trusted.verdict(box)
        pin = trust.pin
        return self.token if trust.trusted and pin is not None and box.addresses[0] == pin.address else None
