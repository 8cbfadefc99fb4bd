"""For apps: find appliances on the LAN and spread requests across them.

    from appliance.client import discover, BoxPool
    boxes = discover(timeout=3)
    client = tritonclient.http.InferenceServerClient(boxes[0].url)   # or:
    pool = BoxPool(boxes); result = pool.infer("mlp", inputs)
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

__all__ = ["Box", "BoxPool", "NoBoxAvailable", "discover"]


@dataclasses.dataclass(frozen=True)
class Box:
    name: str
    addresses: tuple[str, ...]
    port: int
    id: str = ""
    hw: str = ""
    models: int = 0
    version: str = ""

    @property
    def url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient takes it."""
        return f"{self.addresses[0]}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.url}"


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
    )


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
    """Round-robin over boxes with tritonclient; a box that stops answering is dropped for
    ``cooldown`` seconds, then tried again."""

    def __init__(self, boxes: Sequence[Box], cooldown: float = 30.0) -> None:
        if not boxes:
            raise NoBoxAvailable("no boxes given; run discover() first")
        self._boxes = list(boxes)
        self._cooldown = cooldown
        self._down: dict[str, float] = {}
        self._next = 0
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def healthy(self) -> list[Box]:
        now = time.monotonic()
        return [b for b in self._boxes if self._down.get(b.url, 0) <= now]

    def _client(self, box: Box) -> Any:
        import tritonclient.http as triton

        if box.url not in self._clients:
            self._clients[box.url] = triton.InferenceServerClient(box.url, connection_timeout=5, network_timeout=60)
        return self._clients[box.url]

    def infer(self, model: str, inputs: list, **kwargs: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        for _ in range(len(self._boxes)):
            with self._lock:
                candidates = self.healthy()
                if not candidates:
                    break
                box = candidates[self._next % len(candidates)]
                self._next += 1
            try:
                return self._client(box).infer(model, inputs, **kwargs)
            except InferenceServerException:
                raise  # the box answered: a real error for this request
            except Exception:  # no answer (refused, reset, timed out): drop the box for a while
                with self._lock:
                    self._down[box.url] = time.monotonic() + self._cooldown
                    self._clients.pop(box.url, None)
        raise NoBoxAvailable(f"none of {[b.name for b in self._boxes]} answered")
