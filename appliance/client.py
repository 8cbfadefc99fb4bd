"""For apps: find appliances on the LAN and spread requests across them.

    from appliance.client import discover, BoxPool
    boxes = discover(timeout=3)
    client = tritonclient.http.InferenceServerClient(boxes[0].url)        # or over gRPC:
    client = tritonclient.grpc.InferenceServerClient(boxes[0].grpc_url)   # or:
    pool = BoxPool(boxes); result = pool.infer("mlp", inputs)              # BoxPool(boxes, "grpc")
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

from appliance.mdns import KSERVE_TYPE

__all__ = ["PROTOCOLS", "Box", "BoxPool", "NoBoxAvailable", "discover"]

PROTOCOLS = ("http", "grpc")


@dataclasses.dataclass(frozen=True)
class Box:
    name: str
    addresses: tuple[str, ...]
    port: int
    id: str = ""
    hw: str = ""
    models: int = 0
    version: str = ""
    grpc_port: int | None = None
    """The gRPC port, when the box serves gRPC (TXT key ``grpc``)."""

    @property
    def url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient takes it."""
        return f"{self.addresses[0]}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.url}"

    @property
    def grpc_url(self) -> str | None:
        """host:port of the gRPC service, as tritonclient.grpc.InferenceServerClient takes it."""
        return None if self.grpc_port is None else f"{self.addresses[0]}:{self.grpc_port}"

    def url_for(self, protocol: str) -> str | None:
        return self.grpc_url if protocol == "grpc" else self.url


def _box(info: Any) -> Box | None:
    addresses = tuple(socket.inet_ntoa(a) for a in info.addresses if len(a) == 4)
    if not addresses or not info.port:
        return None
    txt = {k.decode(): (v or b"").decode() for k, v in (info.properties or {}).items()}
    return Box(
        name=info.name[: -len(KSERVE_TYPE) - 1],
        addresses=addresses,
        port=info.port,
        id=txt.get("id", ""),
        hw=txt.get("hw", ""),
        models=int(txt.get("models", "0") or 0),
        version=txt.get("version", ""),
        grpc_port=_port(txt.get("grpc")),
    )


def _port(text: str | None) -> int | None:
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        return None
    return int(text)


def discover(timeout: float = 3.0, interfaces: Sequence[str] = ()) -> list[Box]:
    """Boxes answering on the LAN within ``timeout`` seconds, sorted by name."""
    zeroconf = Zeroconf(interfaces=list(interfaces) or InterfaceChoice.All, ip_version=IPVersion.V4Only)
    names: set[str] = set()
    lock = threading.Lock()

    def changed(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        with lock:
            if state_change is ServiceStateChange.Removed:
                names.discard(name)
            else:
                names.add(name)

    browser = ServiceBrowser(zeroconf, KSERVE_TYPE, handlers=[changed])
    try:
        time.sleep(timeout)
        boxes = []
        with lock:
            found = sorted(names)
        for name in found:
            info = zeroconf.get_service_info(KSERVE_TYPE, name, timeout=1500)
            box = _box(info) if info is not None else None
            if box is not None:
                boxes.append(box)
        return sorted(boxes, key=lambda b: b.name)
    finally:
        browser.cancel()
        zeroconf.close()


class NoBoxAvailable(RuntimeError):
    pass


class BoxPool:
    """Round-robin over boxes with tritonclient over ``protocol`` ("http" or "grpc"; boxes that do not
    serve it are left out); a box that stops answering is dropped for ``cooldown`` seconds, then tried
    again. Inputs are the protocol's own (``tritonclient.http.InferInput`` or ``tritonclient.grpc...``)."""

    def __init__(self, boxes: Sequence[Box], protocol: str = "http", cooldown: float = 30.0) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if not boxes:
            raise NoBoxAvailable("no boxes given; run discover() first")
        self._boxes = [b for b in boxes if b.url_for(protocol) is not None]
        if not self._boxes:
            raise NoBoxAvailable(f"none of {[b.name for b in boxes]} serves {protocol}; use protocol='http'")
        self.protocol = protocol
        self._cooldown = cooldown
        self._down: dict[str, float] = {}
        self._next = 0
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def healthy(self) -> list[Box]:
        now = time.monotonic()
        return [b for b in self._boxes if self._down.get(b.url, 0) <= now]

    def _client(self, box: Box) -> Any:
        url = box.url_for(self.protocol)
        assert url is not None
        if url not in self._clients:
            if self.protocol == "grpc":
                import tritonclient.grpc as triton_grpc

                self._clients[url] = triton_grpc.InferenceServerClient(url)
            else:
                import tritonclient.http as triton_http

                self._clients[url] = triton_http.InferenceServerClient(url, connection_timeout=5, network_timeout=60)
        return self._clients[url]

    def _answered(self, error: Exception) -> bool:
        """Whether the box itself answered with this error (so another box would answer the same)."""
        from tritonclient.utils import InferenceServerException

        if not isinstance(error, InferenceServerException):
            return False
        # tritonclient.grpc reports a box it cannot reach as an UNAVAILABLE status too; a box that is
        # stopping or full answers UNAVAILABLE: either way, another box may serve the request.
        return not (self.protocol == "grpc" and error.status() in ("StatusCode.UNAVAILABLE",
                                                                      "StatusCode.DEADLINE_EXCEEDED"))

    def infer(self, model: str, inputs: list, **kwargs: Any) -> Any:
        for _ in range(len(self._boxes)):
            with self._lock:
                candidates = self.healthy()
                if not candidates:
                    break
                box = candidates[self._next % len(candidates)]
                self._next += 1
            try:
                if self.protocol == "grpc" and "client_timeout" not in kwargs:
                    kwargs["client_timeout"] = 60
                return self._client(box).infer(model, inputs, **kwargs)
            except Exception as exc:
                if self._answered(exc):
                    raise  # the box answered: a real error for this request
                with self._lock:  # no answer (refused, reset, timed out): drop the box for a while
                    self._down[box.url] = time.monotonic() + self._cooldown
                    self._clients.pop(box.url_for(self.protocol) or "", None)
        raise NoBoxAvailable(f"none of {[b.name for b in self._boxes]} answered")
