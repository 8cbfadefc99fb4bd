"""Typed application keys shared by the REST modules."""

from __future__ import annotations

from aiohttp import web
from hardware_probe import ProbeReport

from appliance.core.dataplane import DataPlane
from appliance.settings import Settings

__all__ = ["DATAPLANE", "PROBE", "SETTINGS"]

SETTINGS = web.AppKey("settings", Settings)
DATAPLANE = web.AppKey("dataplane", DataPlane)
PROBE = web.AppKey("probe", ProbeReport)
