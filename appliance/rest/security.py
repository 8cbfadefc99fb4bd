"""Who may do what, and how much at once: bearer tokens for control endpoints (or everything), and a
bound on requests in flight. Both are aiohttp middlewares; their errors go through the error middleware."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from appliance.access import Network, address_in, check_bearer, parse_networks
from appliance.errors import Unavailable
from appliance.fleet_signature import FleetVerifier, parse
from appliance.rest.body import SIGNED_BODY
from appliance.rest.browser import HostPolicy, check_control_request, check_host
from appliance.rest.keys import SETTINGS

__all__ = [
    "ACCESS",
    "AccessRules",
    "client_address",
    "concurrency_middleware",
    "install",
    "make_auth_middleware",
    "parse_networks",
]

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True, slots=True)
class AccessRules:
    """Who may call what: routes are told apart by the handler that matched, never by the path text
    (a path with %2F decodes differently from how it routes)."""

    token: str
    control: frozenset[Callable[..., Any]]
    """Handlers that change the server's state: the token (unless exempt) and the browser checks."""
    open: frozenset[Callable[..., Any]]
    """Handlers that need nothing, even with protect_inference (health)."""
    exempt: tuple[Network, ...]
    trusted_proxies: tuple[Network, ...] = ()
    unlimited: frozenset[Callable[..., Any]] = frozenset()
    """Handlers outside max_concurrent_requests: a box busy with (or flooded by) requests still answers
    its health checks and metrics."""
    protect_inference: bool = False
    hosts: HostPolicy = dataclasses.field(default_factory=lambda: HostPolicy(frozenset(), any_host=True))
    signatures: FleetVerifier | None = None
    """Verifies Fleet-signed requests (appliance.fleet_signature), which prove the token without carrying
    it; accepted wherever the bearer token is. None: bearer tokens only."""


def client_address(request: web.Request, trusted_proxies: tuple[Network, ...]) -> str | None:
    """The client's address: the peer's, or, when the peer is a trusted proxy, the last address in
    X-Forwarded-For that is not one of the trusted proxies."""
    peer = request.remote
    if not trusted_proxies or not address_in(peer, trusted_proxies):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getall("X-Forwarded-For", [])).split(",") if h.strip()]
    for hop in reversed(hops):
        if not address_in(hop, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def make_auth_middleware(rules: AccessRules):
    @web.middleware
    async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
        check_host(request, rules.hosts)
        matched = request.match_info.handler
        control = matched in rules.control
        if control:
            check_control_request(request)
        guarded = control or (rules.protect_inference and matched not in rules.open)
        if guarded and not address_in(client_address(request, rules.trusted_proxies), rules.exempt):
            _check_credentials(request, rules)
        return await handler(request)

    return auth_middleware


def _check_credentials(request: web.Request, rules: AccessRules) -> None:
    """The bearer token, or a Fleet signature (its body is checked as it is read: rest/body.py)."""
    value = request.headers.get("Authorization")
    if rules.signatures is not None and parse(value) is not None:
        request[SIGNED_BODY] = rules.signatures.verify(value, request.method, request.raw_path)
        return
    check_bearer(value, rules.token, "'Authorization: Bearer <token>' (or a Fleet signature: appliance push)")


@web.middleware
async def concurrency_middleware(request: web.Request, handler) -> web.StreamResponse:
    app = request.app
    if request.match_info.handler in app[ACCESS].unlimited:
        return await handler(request)
    limit = app[SETTINGS].max_concurrent_requests
    state = app[_IN_FLIGHT]
    if state[0] >= limit:
        raise Unavailable(f"the server is handling {limit} requests already (max_concurrent_requests); retry",
                          retry_after=1)
    state[0] += 1
    try:
        return await handler(request)
    finally:
        state[0] -= 1


_IN_FLIGHT = web.AppKey("in_flight", list)


ACCESS = web.AppKey("access", AccessRules)


def install(app: web.Application, rules: AccessRules, limit_requests: bool = True) -> None:
    """Add the middlewares (auth first, then the in-flight bound) to an application being built."""
    app[ACCESS] = rules
    app[_IN_FLIGHT] = [0]
    app.middlewares.append(make_auth_middleware(rules))
    if limit_requests:
        app.middlewares.append(concurrency_middleware)
