"""Typed application keys shared by the REST modules."""

from __future__ import annotations

from aiohttp import web

from appliance.core.dataplane import DataPlane
from appliance.metrics.service import MetricsService
from appliance.rest.codec import DecodeLimits
from appliance.settings import Settings
from appliance.state import StateDir

__all__ = ["DATAPLANE", "LIMITS", "METRICS", "SETTINGS", "STATE"]

SETTINGS = web.AppKey("settings", Settings)
DATAPLANE = web.AppKey("dataplane", DataPlane)
METRICS = web.AppKey("metrics", MetricsService)
LIMITS = web.AppKey("limits", DecodeLimits)
STATE = web.AppKey("state", StateDir)
