"""The REST front end: an aiohttp application over the data plane (routes, the error middleware, the
admission middleware). It parses and serialises; it builds no resource (``appliance.composition`` does)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from appliance.core.errors import Unavailable
from appliance.mdns.fleet import FleetView
from appliance.metrics.service import MetricsService
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation
from appliance.rest.error_middleware import error_middleware
from appliance.rest.handlers import OPERATIONS, ROUTES
from appliance.rest.keys import CONFIG, DATAPLANE, FLEET, METRICS
from appliance.rest.keys import OPERATIONS as OPERATIONS_KEY
from appliance.rest.rest_config import RestConfig
from appliance.rest.security import admission_middleware

__all__ = ["build_app", "build_metrics_app"]


def _application(dataplane: DataPlane, config: RestConfig, client_max_size: int = 1024**2) -> web.Application:
    app = web.Application(client_max_size=client_max_size, middlewares=[error_middleware, admission_middleware])
    app[CONFIG] = config
    app[DATAPLANE] = dataplane
    return app


def build_app(dataplane: DataPlane, config: RestConfig, *, metrics: MetricsService | None = None,
              fleet: FleetView | None = None) -> web.Application:
    """``metrics``: what /metrics serves (None: metrics off); ``fleet``: the boxes the daemon's mDNS
    browser sees (None: mDNS off)."""
    app = _application(dataplane, config, config.body.max_bytes)
    if metrics is not None:
        app[METRICS] = metrics
    app[FLEET] = fleet or FleetView(None, None)
    app[OPERATIONS_KEY] = OPERATIONS
    app.add_routes(ROUTES)
    return app


def build_metrics_app(dataplane: DataPlane, config: RestConfig, metrics: MetricsService) -> web.Application:
    """The separate metrics port (Triton's 8002): /metrics, nothing else, with the main port's rules."""

    async def serve_metrics(request: web.Request) -> web.Response:
        if metrics is None:
            raise Unavailable("metrics are not running")
        return web.Response(body=await asyncio.to_thread(metrics.prometheus),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = _application(dataplane, config)
    app[OPERATIONS_KEY] = {serve_metrics: Operation.METRICS}
    app.router.add_get("/metrics", serve_metrics)
    return app
