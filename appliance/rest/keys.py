"""Typed application keys shared by the REST modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from appliance.mdns.fleet import FleetView
from appliance.metrics.service import MetricsService
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation
from appliance.rest.rest_config import RestConfig

__all__ = ["CONFIG", "DATAPLANE", "FLEET", "METRICS", "OPERATIONS"]

CONFIG = web.AppKey("config", RestConfig)
DATAPLANE = web.AppKey("dataplane", DataPlane)
METRICS = web.AppKey("metrics", MetricsService)
FLEET = web.AppKey("fleet", FleetView)
OPERATIONS: web.AppKey[Mapping[Callable[..., Any], Operation]] = web.AppKey("operations")
"""The operation each route's handler performs: what the admission middleware admits."""
