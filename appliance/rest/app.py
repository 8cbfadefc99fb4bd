"""The REST front end: an aiohttp application over a started ``Appliance`` (routes, the error
middleware, access rules). It parses and serialises; it builds no resource (``appliance.composition`` does)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from appliance.composition import Appliance
from appliance.errors import Unavailable
from appliance.fleet_signature import FleetVerifier
from appliance.mdns.fleet import FleetView
from appliance.rest import security
from appliance.rest.body import BodyLimits
from appliance.rest.browser import host_policy
from appliance.rest.codec import DecodeLimits
from appliance.rest.error_middleware import error_middleware
from appliance.rest.handlers import CONTROL_HANDLERS, OPEN_HANDLERS, ROUTES, UNLIMITED_HANDLERS
from appliance.rest.keys import (
    BODY_LIMITS,
    BUDGET,
    DATAPLANE,
    FLEET,
    LIMITS,
    LOGS,
    METRICS,
    SETTINGS,
    SIGNATURES,
    STATE,
    TRACES,
)
from appliance.settings import Settings

__all__ = ["access_rules", "build_app", "build_metrics_app"]


def access_rules(settings: Settings, token: str, signatures: FleetVerifier | None = None) -> security.AccessRules:
    return security.AccessRules(
        token=token,
        signatures=signatures,
        control=CONTROL_HANDLERS,
        open=OPEN_HANDLERS,
        unlimited=UNLIMITED_HANDLERS,
        exempt=security.parse_networks(settings.auth_exempt_networks),
        trusted_proxies=security.parse_networks(settings.trusted_proxies),
        protect_inference=settings.protect_inference,
        hosts=host_policy(settings.allowed_hosts, settings.name),
    )


def build_app(appliance: Appliance, fleet: FleetView | None = None) -> web.Application:
    """``fleet``: the boxes the daemon's mDNS browser sees (None: mDNS off)."""
    settings = appliance.settings
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    app[STATE] = appliance.state
    app[LOGS] = appliance.logs
    app[DATAPLANE] = appliance.dataplane
    if appliance.metrics is not None:
        app[METRICS] = appliance.metrics
    app[LIMITS] = DecodeLimits(settings.max_tensor_elements, settings.max_inputs)
    app[BODY_LIMITS] = BodyLimits(settings.max_request_bytes, settings.body_timeout)
    app[BUDGET] = appliance.budget
    app[TRACES] = appliance.traces
    app[FLEET] = fleet or FleetView(None, None)
    app[SIGNATURES] = appliance.signatures
    security.install(app, access_rules(settings, appliance.token, appliance.signatures))
    app.add_routes(ROUTES)
    return app


def build_metrics_app(main: web.Application) -> web.Application:
    """The separate metrics port (Triton's 8002): /metrics of the main application, nothing else."""
    app = web.Application(middlewares=[error_middleware])
    app[SETTINGS] = main[SETTINGS]
    # The same token and Host rules as the main port; scrapes stay outside the request bound.
    security.install(app, main[security.ACCESS], limit_requests=False)

    async def metrics(request: web.Request) -> web.Response:
        service = main.get(METRICS)
        if service is None:
            raise Unavailable("metrics are not running")
        return web.Response(body=await asyncio.to_thread(service.prometheus),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
    return app
