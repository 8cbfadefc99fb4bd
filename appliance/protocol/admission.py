"""Who may call what, and how many at once: the same decision for every transport, made before the
server holds any of the request's bytes.

A front end describes its client as a ``Caller`` (its address, the credentials it sent, and for HTTP
whether a web page on another site may have sent it), names the ``Operation`` and asks
``Admission.admit``; the access level comes from ``appliance.protocol.operations.ACCESS``.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
import ipaddress
from collections.abc import Iterable

from appliance.core.errors import ApplianceError, Unauthorized, Unavailable
from appliance.protocol.operations import ACCESS, BOUNDLESS, Access, Operation
from appliance.security.fleet_signature import FleetVerifier, parse

__all__ = ["AccessPolicy", "Admission", "Admitted", "Caller", "Network", "address_in", "check_bearer", "parse_networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(networks: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in networks)


def address_in(address: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether ``address`` (an IP literal, maybe with an IPv6 zone) lies in one of ``networks``; junk and
    None (a UNIX socket peer) lie in none."""
    if not address or not networks:
        return False
    literal = address.split("%")[0]
    if len(literal) > _LONGEST_LITERAL:  # junk (a forwarded header may hold anything): never kept
        return False
    parsed = _parsed(literal)
    return parsed is not None and any(parsed in network for network in networks)


_LONGEST_LITERAL = 45
"""The longest IP literal ipaddress reads ("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255")."""


@functools.lru_cache(maxsize=1024)
def _parsed(literal: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as ``ipaddress`` reads it (None for junk): asked for every request a guarded operation
    gets, from the few addresses of a LAN's clients, and ~5 µs to parse each time. Bounded: 1024 literals
    of at most _LONGEST_LITERAL characters; a client that sends many forwarded addresses only cycles it."""
    try:
        return ipaddress.ip_address(literal)
    except ValueError:
        return None


def check_bearer(value: str | None, token: str, how: str) -> None:
    """Raise ``Unauthorized`` unless ``value`` is ``Bearer <token>`` (compared in constant time; an empty
    bearer never matches). ``how`` tells the client where the token goes."""
    scheme, _, given = (value or "").partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized(
            f"this endpoint needs {how} from this address; the token is in <state-dir>/auth-token on the "
            "appliance (or the auth_token setting)"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """The client of one request, as its transport sees it."""

    address: str | None
    """Its IP address (behind a trusted proxy, the one the proxy forwarded); None for a UNIX socket."""
    authorization: str | None = None
    """The credentials it sent (``Bearer <token>``), from the Authorization header or metadata."""
    credentials: str = "'Authorization: Bearer <token>'"
    """Where this transport's clients put the token, for the refusal's message."""
    connected_to: str | None = None
    """The address of this host its connection reached, when the transport knows it."""
    direct: bool = True
    """Whether ``address`` is the connection's own peer (False: a proxy forwarded it)."""
    browser_refusal: ApplianceError | None = None
    """The error for this request where browser rules apply (control operations, requests naming a
    shared-memory region): set when a page of another site may have sent it; None otherwise."""
    request_line: tuple[str, str] | None = None
    """The method and the target (path and query, as sent) where the transport has them (HTTP): what a
    signed request (``Authorization: Fleet ...``) covers. None: signed requests are not taken."""
    always_counted: bool = False
    """Whether its requests count in max_concurrent_requests even where the operation is ``BOUNDLESS``
    (health): gRPC's do, as each call costs a stream, a task and a handler whatever it asks (a flood of
    ServerLive calls was not bounded); HTTP's health checks and scrapes stay outside, so that a box busy
    with (or flooded by) requests still answers them."""


@dataclasses.dataclass(frozen=True, slots=True)
class AccessPolicy:
    token: str
    exempt: tuple[Network, ...] = ()
    """Clients in these networks need no token (auth_exempt_networks)."""
    protect_inference: bool = False
    signatures: FleetVerifier | None = None
    """Verifies signed requests, which prove the token without carrying it (the fleet commands send
    them); taken wherever the bearer token is, from callers that give their request line."""

    def check(self, operation: Operation, caller: Caller) -> str | None:
        """Raise the refusal (Forbidden, UnsupportedMediaType, Unauthorized) if ``caller`` may not ask for
        ``operation``. For a signed request, the SHA-256 (hex) its body must have: the transport checks
        it as it reads the body."""
        level = ACCESS[operation]
        if level is Access.CONTROL and caller.browser_refusal is not None:
            raise caller.browser_refusal
        guarded = level is Access.CONTROL or (self.protect_inference and level is not Access.OPEN)
        if guarded and not address_in(caller.address, self.exempt):
            line = caller.request_line
            if self.signatures is not None and line is not None and parse(caller.authorization) is not None:
                return self.signatures.verify(caller.authorization, *line)
            check_bearer(caller.authorization, self.token, caller.credentials)
        return None


class Admission:
    """The access policy and the bound on requests handled at once (``max_concurrent_requests``), over
    every front end together. Single-threaded: used on the event loop only."""

    def __init__(self, policy: AccessPolicy, max_concurrent_requests: int = 1024) -> None:
        if max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be at least 1, got {max_concurrent_requests}")
        self.policy = policy
        self.limit = max_concurrent_requests
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def check(self, operation: Operation, caller: Caller) -> str | None:
        return self.policy.check(operation, caller)

    def admit(self, operation: Operation, caller: Caller, proof: object = None) -> Admitted:
        """Held while the request is handled: refused on entry (before it holds any bytes) when the caller
        may not ask for ``operation`` or max_concurrent_requests are running already. Entering gives the
        body digest a signed request must match (see AccessPolicy.check). ``proof``: the ``Admitted.proof``
        of an earlier request with the same operation and caller (a connection that sends the same head
        again), whose access check then stands (the bound is counted all the same)."""
        return Admitted(self, operation, caller, proof)


class Admitted:
    """One request's admission (``Admission.admit``): a context manager, a class rather than a generator
    because every request enters one."""

    __slots__ = ("_admission", "_operation", "_caller", "_counted", "proof")

    def __init__(self, admission: Admission, operation: Operation, caller: Caller, proof: object = None) -> None:
        self._admission = admission
        self._operation = operation
        self._caller = caller
        self._counted = False
        self.proof = proof
        """Once entered: what an identical later request may show to skip the access check (``admit``), or
        None (a signed request proves itself each time: its signature covers a nonce used once)."""

    def __enter__(self) -> str | None:
        admission = self._admission
        policy = admission.policy
        if self.proof is policy:  # this caller passed this check before
            signed_body = None
        else:
            signed_body = policy.check(self._operation, self._caller)
            self.proof = policy if signed_body is None else None
        if self._operation in BOUNDLESS and not self._caller.always_counted:
            return signed_body
        if admission._in_flight >= admission.limit:
            raise Unavailable(f"the server is handling {admission.limit} requests already "
                              "(max_concurrent_requests); retry", retry_after=1)
        admission._in_flight += 1
        self._counted = True
        return signed_body

    def __exit__(self, *exc_info: object) -> None:
        if self._counted:
            self._counted = False
            self._admission._in_flight -= 1
