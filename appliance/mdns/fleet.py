"""The boxes this daemon sees on the LAN, as the dashboard's fleet panel shows them (GET /v2/fleet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from appliance.client.boxes import Box

__all__ = ["FleetView"]


class _Boxes(Protocol):
    def boxes(self) -> list[Box]: ...


class FleetView:
    """``browser``: follows the LAN (appliance.client.Browser); None when mDNS is off. ``own_id``: this
    box's id, to mark it in the list."""

    def __init__(self, browser: _Boxes | None, own_id: str | None, reason: str | None = None) -> None:
        """``reason``: why there is no browser (default: mDNS is off)."""
        self._browser = browser
        self._own_id = own_id
        self._reason = reason or "mDNS is off on this box (--no-mdns): start it with mDNS on to see the other boxes"

    def as_json(self) -> dict[str, Any]:
        if self._browser is None:
            return {"mdns": False, "boxes": [], "reason": self._reason}
        return {"mdns": True, "boxes": [{
            "name": box.name, "self": bool(self._own_id) and box.id == self._own_id, "id": box.id,
            "url": box.base_url, "dashboard": box.base_url + "/", "addresses": list(box.addresses),
            "port": box.port, "grpc_port": box.grpc_port, "hw": box.hw, "models": box.models,
            "version": box.version, "tls": list(box.tls),
        } for box in self._browser.boxes()]}
