"""Typed application keys shared by the REST modules."""

from __future__ import annotations

from aiohttp import web

from appliance.budget import MemoryBudget
from appliance.fleet_signature import FleetVerifier
from appliance.mdns.fleet import FleetView
from appliance.metrics.service import MetricsService
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.log_settings import LogSettings
from appliance.protocol.trace_settings import TraceSettings
from appliance.rest.body import BodyLimits
from appliance.rest.codec import DecodeLimits
from appliance.settings import Settings
from appliance.state import StateDir

__all__ = ["BODY_LIMITS", "BUDGET", "DATAPLANE", "FLEET", "LIMITS", "LOGS", "METRICS", "SETTINGS", "SIGNATURES",
           "STATE", "TRACES"]

SETTINGS = web.AppKey("settings", Settings)
DATAPLANE = web.AppKey("dataplane", DataPlane)
METRICS = web.AppKey("metrics", MetricsService)
LIMITS = web.AppKey("limits", DecodeLimits)
BODY_LIMITS = web.AppKey("body_limits", BodyLimits)
BUDGET = web.AppKey("budget", MemoryBudget)
STATE = web.AppKey("state", StateDir)
LOGS = web.AppKey("logs", LogSettings)
TRACES = web.AppKey("traces", TraceSettings)
FLEET = web.AppKey("fleet", FleetView)
SIGNATURES = web.AppKey("signatures", FleetVerifier)
