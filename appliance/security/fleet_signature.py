"""Signed requests: a fleet client proves it holds a box's token without ever sending it.

The box hands out nonces (``GET /v2/fleet/nonce``: ``{"id": <box id>, "nonce": ...}``, no token
needed); the client signs one request with one nonce and sends

    Authorization: Fleet id="<box id>", nonce="<nonce>", body="<sha-256 of the body, hex>", mac="<hex>"

where ``mac`` is HMAC-SHA256, keyed with a key derived from the token, of the box id, the nonce, the
method, the request target (path and query, as sent) and the body's digest. The box checks, in this
order: the id is its own, the nonce is one it issued (a tag keyed with a secret of this process) less
than ``NONCE_TTL`` seconds ago, the mac, and that the nonce was not used before; the body it receives
must then have the digest signed, in every case: a request without a body (none, ``Content-Length: 0``,
a chunked body of no chunks) has the empty body, whose digest (``EMPTY_BODY``, the SHA-256 of ``b""``)
is signed and checked like any other, and a body no handler reads is checked all the same. So what a
box that is not the one signed for receives (a fake box on the LAN) is good for nothing: it is bound to
another box id, to a nonce only that box would take, once, for one request with one body (stripping the
body makes it another request). A restart of the box forgets its nonces (a new secret).

Transport-free: the daemon's REST front end verifies with ``FleetVerifier``; the CLI signs with ``sign``.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import hashlib
import hmac
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable

from appliance.core.errors import Unauthorized, Unavailable

__all__ = ["EMPTY_BODY", "NONCE_PATH", "NONCE_TTL", "SCHEME", "FleetVerifier", "Signature", "body_digest", "parse",
           "sign"]

SCHEME = "Fleet"
NONCE_PATH = "/v2/fleet/nonce"
NONCE_TTL = 60.0
"""Seconds a nonce stays good for (one request each)."""
_VERSION = b"appliance-fleet-v1"
_TAG_BYTES = 16
_NONCE_BYTES = 8 + 12 + _TAG_BYTES  # issue time (ms, monotonic), random, tag
_MAX_HEADER = 512
_PARAM = re.compile(r'\s*([a-z]+)="([A-Za-z0-9_\-.:]{1,128})"\s*(?:,|$)')
_HEX64 = re.compile(r"[0-9a-f]{64}")


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


EMPTY_BODY = body_digest(b"")
"""The digest of a request without a body: what such a request is signed for, and checked against."""


def _key(token: str) -> bytes:
    """The signing key: derived from the token, so that a signature is never a use of the token itself."""
    return hmac.new(token.encode(), _VERSION + b" key", hashlib.sha256).digest()


def _mac(key: bytes, box_id: str, nonce: str, method: str, target: str, digest: str) -> str:
    message = b"\n".join([_VERSION, box_id.encode(), nonce.encode(), method.upper().encode(), target.encode(),
                          digest.encode()])
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(token: str, box_id: str, nonce: str, method: str, target: str, body: bytes = b"") -> str:
    """The Authorization header value for one request (``target``: path and query, exactly as sent;
    ``body``: the bytes sent, ``b""`` for a request without a body, which is signed as the empty body)."""
    digest = body_digest(body)
    mac = _mac(_key(token), box_id, nonce, method, target, digest)
    return f'{SCHEME} id="{box_id}", nonce="{nonce}", body="{digest}", mac="{mac}"'


@dataclasses.dataclass(frozen=True, slots=True)
class Signature:
    id: str
    nonce: str
    body: str
    """The hex SHA-256 digest the request's body must have."""
    mac: str


def parse(value: str | None) -> Signature | None:
    """The signature in an Authorization header; None when the header uses another scheme (a bearer
    token); Unauthorized when it is a malformed Fleet header."""
    scheme, _, rest = (value or "").partition(" ")
    if scheme.lower() != SCHEME.lower():
        return None
    if len(rest) > _MAX_HEADER:
        raise Unauthorized("the Fleet signature header is too long")
    params: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _PARAM.match(rest, position)
        if match is None or match.end() == position:
            raise Unauthorized('malformed Fleet signature; expected Fleet id="...", nonce="...", body="...", mac="..."')
        params[match.group(1)] = match.group(2)
        position = match.end()
    if set(params) != {"id", "nonce", "body", "mac"} or not (_HEX64.fullmatch(params["body"])
                                                            and _HEX64.fullmatch(params["mac"])):
        raise Unauthorized('malformed Fleet signature; expected Fleet id="...", nonce="...", body="<sha-256 hex>", '
                           'mac="<hmac-sha-256 hex>"')
    return Signature(**params)


class FleetVerifier:
    """Issues nonces and verifies signed requests for one box (thread-safe). ``clock``: monotonic seconds."""

    def __init__(self, token: str, box_id: str, ttl: float = NONCE_TTL, max_used: int = 65536,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.box_id = box_id
        self._key = _key(token)
        self._secret = secrets.token_bytes(32)
        self._ttl_ms = int(ttl * 1000)
        self._max_used = max_used
        self._clock = clock
        self._epoch = secrets.randbits(40)  # nonces show no uptime
        self._used: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> expiry (ms)
        self._lock = threading.Lock()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000) + self._epoch

    def _tag(self, head: bytes) -> bytes:
        return hmac.new(self._secret, head, hashlib.sha256).digest()[:_TAG_BYTES]

    def nonce(self) -> str:
        """A fresh nonce: stateless (its issue time and a tag keyed with this process's secret), so
        handing them out costs no memory whoever asks."""
        head = struct.pack(">Q", self._now_ms()) + secrets.token_bytes(12)
        return base64.urlsafe_b64encode(head + self._tag(head)).decode().rstrip("=")

    def _issued_ms(self, nonce: str) -> int | None:
        """When this process issued ``nonce``; None for one it did not issue."""
        try:
            raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _NONCE_BYTES or not hmac.compare_digest(raw[-_TAG_BYTES:], self._tag(raw[:-_TAG_BYTES])):
            return None
        return int(struct.unpack(">Q", raw[:8])[0])

    def verify(self, value: str | None, method: str, target: str) -> str:
        """Check a signed request's header; return the body digest its body must have. The caller checks
        the body it receives against it in every case (``EMPTY_BODY`` when none came), whether or not
        anything reads that body. Unauthorized, saying why, otherwise."""
        signature = parse(value)
        if signature is None:
            raise Unauthorized(f"expected a {SCHEME} signature")
        if signature.id != self.box_id:
            raise Unauthorized(f"this request was signed for box {signature.id}, and this is box {self.box_id}: "
                               "the client pinned another box at this address; check it, then pin this one again "
                               "(appliance fleet trust NAME)")
        issued = self._issued_ms(signature.nonce)
        now = self._now_ms()
        if issued is None or not 0 <= now - issued <= self._ttl_ms:
            raise Unauthorized(f"the signature's nonce was not issued by this box, or is older than "
                               f"{self._ttl_ms // 1000} s (or the box restarted): ask {NONCE_PATH} for a new one")
        expected = _mac(self._key, self.box_id, signature.nonce, method, target, signature.body)
        if not hmac.compare_digest(expected, signature.mac):
            raise Unauthorized("the request's signature does not match: signed with another token, or for another "
                               "method, path or body; the token is in <state-dir>/auth-token on the appliance")
        with self._lock:
            while self._used and next(iter(self._used.values())) < now:
                self._used.popitem(last=False)
            if signature.nonce in self._used:
                raise Unauthorized(f"this nonce was used already (a replayed request?): ask {NONCE_PATH} for a "
                                   "new one for each request")
            if len(self._used) >= self._max_used:
                raise Unavailable(f"more than {self._max_used} signed requests in {self._ttl_ms // 1000} s; retry")
            self._used[signature.nonce] = issued + self._ttl_ms
        return signature.body

    @staticmethod
    def check_body(expected: str, actual: str) -> None:
        if not hmac.compare_digest(expected, actual):
            raise Unauthorized("the request's body is not the one its signature covers (changed on the way?)")
