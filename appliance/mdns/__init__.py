"""LAN discovery: the daemon announces itself over mDNS; apps find boxes with appliance.client (which
defines the service types both sides use)."""

from appliance.client.boxes import HTTP_TYPE, KSERVE_TYPE

__all__ = ["HTTP_TYPE", "KSERVE_TYPE"]
