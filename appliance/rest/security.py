"""Who may do what, and how much at once: bearer tokens for control endpoints (or everything), and a
bound on requests in flight. Both are aiohttp middlewares; their errors go through the error middleware."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
from pathlib import Path

from aiohttp import web

from appliance.errors import Unauthorized, Unavailable
from appliance.rest.keys import SETTINGS

__all__ = ["concurrency_middleware", "ensure_token", "install", "make_auth_middleware"]

log = logging.getLogger(__name__)

# Endpoints that change the server's state.
_CONTROL = re.compile(r"^/v2/repository/models/[^/]+/(load|unload)$")
_OPEN = re.compile(r"^/v2/health/(live|ready)$")


def ensure_token(state_dir: Path) -> str:
    """The token in <state_dir>/auth-token, created with mode 0600 on first start (blocking)."""
    path = state_dir / "auth-token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its token
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    log.info("created the control token in %s (mode 0600)", path)
    return token


def make_auth_middleware(token: str):
    expected = token.encode()

    @web.middleware
    async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
        settings = request.app[SETTINGS]
        path = request.path
        guarded = bool(_CONTROL.match(path)) or (settings.protect_inference and not _OPEN.match(path))
        if guarded and not _exempt(request.remote, settings.auth_exempt_networks):
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
                raise Unauthorized(
                    "this endpoint needs 'Authorization: Bearer <token>' from this address; the token is in "
                    "<state-dir>/auth-token on the appliance (or the auth_token setting)"
                )
        return await handler(request)

    return auth_middleware


def _exempt(remote: str | None, networks: tuple[str, ...]) -> bool:
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.split("%")[0])
    except ValueError:
        return False  # e.g. a UNIX socket peer
    return any(address in ipaddress.ip_network(network, strict=False) for network in networks)


# Health and metrics stay outside the bound: a box busy with (or flooded by) requests still says so.
_UNLIMITED = re.compile(r"^(/v2/health/(live|ready)|/metrics)$")


@web.middleware
async def concurrency_middleware(request: web.Request, handler) -> web.StreamResponse:
    if _UNLIMITED.match(request.path):
        return await handler(request)
    app = request.app
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


def install(app: web.Application, token: str) -> None:
    """Add the middlewares (auth first, then the in-flight bound) to an application being built."""
    app[_IN_FLIGHT] = [0]
    app.middlewares.append(make_auth_middleware(token))
    app.middlewares.append(concurrency_middleware)
