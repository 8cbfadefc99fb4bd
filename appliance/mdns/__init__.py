"""LAN discovery: the daemon announces itself over mDNS; apps find boxes with appliance.client."""

KSERVE_TYPE = "_kserve-v2._tcp.local."
HTTP_TYPE = "_http._tcp.local."

__all__ = ["HTTP_TYPE", "KSERVE_TYPE"]
