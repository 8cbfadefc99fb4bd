"""Boxes on the LAN: what an mDNS record says of one, a one-off ``discover`` and a live ``Browser``."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

__all__ = ["HTTP_TYPE", "KSERVE_TYPE", "PROTOCOLS", "Box", "Browser", "discover", "host_port", "numeric_addresses"]

log = logging.getLogger(__name__)

PROTOCOLS = ("http", "grpc")
KSERVE_TYPE = "_kserve-v2._tcp.local."
"""The mDNS service type a box announces (appliance.mdns.announcer) and apps browse for."""
HTTP_TYPE = "_http._tcp.local."


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
    catalog: str = ""
    """A digest of the names of the box's ready models (TXT key ``mset``): it changes when they do."""
    tls: tuple[str, ...] = ()
    """The protocols (of ``PROTOCOLS``) the box serves over TLS (TXT key ``tls``: ``http,grpc``)."""

    @classmethod
    def at(cls, url: str, grpc_port: int | None = None) -> Box:
        """A box known by address (``host:port``, ``http://host:port``, or ``https://host:port``: TLS on
        its HTTP port), not found over mDNS."""
        secure = url.startswith("https://")
        text = url.removeprefix("https://" if secure else "http://").rstrip("/")
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port such as 192.168.1.20:8000, got {url!r}")
        return cls(name=text, addresses=(host.removeprefix("[").removesuffix("]"),), port=int(port),
                   grpc_port=grpc_port, tls=("http",) if secure else ())

    @property
    def url(self) -> str:
        """host:port, as tritonclient.http.InferenceServerClient takes it."""
        return host_port(self.addresses[0], self.port)

    @property
    def base_url(self) -> str:
        return f"{'https' if 'http' in self.tls else 'http'}://{self.url}"

    @property
    def grpc_url(self) -> str | None:
        """host:port of the gRPC service, as tritonclient.grpc.InferenceServerClient takes it."""
        return None if self.grpc_port is None else host_port(self.addresses[0], self.grpc_port)

    def url_for(self, protocol: str) -> str | None:
        return self.grpc_url if protocol == "grpc" else self.url


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:8000``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def numeric_addresses(host: str, port: int) -> tuple[str, ...]:
    """The numeric addresses ``host`` stands for (itself when it is one, written the one way; a name
    resolved), in getaddrinfo's order; () when it resolves to none. Whoever checks an address against
    something (a pinned box) connects to the number checked, never to the name again: a second lookup
    may answer otherwise."""
    bare = host.removeprefix("[").removesuffix("]")
    try:
        return (str(ipaddress.ip_address(bare)),)
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in found))


def parse_box(info: Any) -> Box | None:
    """The box an mDNS service record describes (None when it has no IPv4 address or port)."""
    addresses = tuple(socket.inet_ntoa(a) for a in info.addresses if len(a) == 4)
    if not addresses or not info.port:
        return None
    txt = {k.decode(): (v or b"").decode() for k, v in (info.properties or {}).items()}
    models = txt.get("models", "0")
    return Box(
        name=info.name[: -len(KSERVE_TYPE) - 1],
        addresses=addresses,
        port=info.port,
        id=txt.get("id", ""),
        hw=txt.get("hw", ""),
        models=int(models) if models.isdigit() else 0,
        version=txt.get("version", ""),
        grpc_port=_port(txt.get("grpc")),
        catalog=txt.get("mset", ""),
        tls=tuple(p for p in PROTOCOLS if p in txt.get("tls", "").split(",")),
    )


def _port(text: str | None) -> int | None:
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        return None
    return int(text)


def _zeroconf(interfaces: Sequence[str]) -> Zeroconf:
    return Zeroconf(interfaces=list(interfaces) or InterfaceChoice.All, ip_version=IPVersion.V4Only)


def discover(timeout: float = 3.0, interfaces: Sequence[str] = ()) -> list[Box]:
    """Boxes answering on the LAN within ``timeout`` seconds, sorted by name."""
    with Browser(interfaces) as browser:
        time.sleep(timeout)
        browser.settle(2.0)
        return browser.boxes()


class Browser:
    """Follows the boxes on the LAN live, in background threads: ``boxes()`` is what answers now;
    ``listen(callback)`` is told ``callback(box, present)`` when a box appears, changes its record
    (its ready models, addresses...) or leaves (goodbye packet or expiry). Thread-safe."""

    def __init__(self, interfaces: Sequence[str] = ()) -> None:
        self._zeroconf = _zeroconf(interfaces)
        self._boxes: dict[str, Box] = {}
        self._listeners: list[Callable[[Box, bool], None]] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, ServiceStateChange] | None] = queue.Queue()
        self._resolver = threading.Thread(target=self._resolve, name="mdns-resolve", daemon=True)
        self._resolver.start()
        self._browser = ServiceBrowser(self._zeroconf, KSERVE_TYPE, handlers=[self._changed])

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def boxes(self) -> list[Box]:
        with self._lock:
            return sorted(self._boxes.values(), key=lambda b: b.name)

    def listen(self, callback: Callable[[Box, bool], None]) -> None:
        """``callback`` (called on a browser thread, keep it short) is told of every box known now and
        of every change from now on."""
        with self._lock:
            self._listeners.append(callback)
            known = list(self._boxes.values())
        for box in known:
            callback(box, True)

    def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the records heard so far are resolved."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _changed(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        # zeroconf's own thread: resolving here would block it, so the resolver thread does it.
        self._queue.put((name, state_change))

    def _resolve(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                name, change = item
                if change is ServiceStateChange.Removed:
                    self._update(name, None)
                    continue
                info = self._zeroconf.get_service_info(KSERVE_TYPE, name, timeout=1500)
                box = parse_box(info) if info is not None else None
                if box is not None:
                    self._update(name, box)
            except Exception:  # noqa: BLE001 - one bad record must not stop following the others
                log.exception("cannot resolve an mDNS record")
            finally:
                self._queue.task_done()

    def _update(self, name: str, box: Box | None) -> None:
        with self._lock:
            old = self._boxes.pop(name, None) if box is None else self._boxes.get(name)
            if box is not None:
                if old == box:
                    return
                self._boxes[name] = box
            listeners = list(self._listeners)
        gone = box is None
        if gone and old is None:
            return
        for callback in listeners:
            try:
                callback(box if box is not None else old, not gone)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the browser
                log.exception("mDNS browser listener failed")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._browser.cancel()
        self._queue.put(None)
        self._resolver.join(5)
        with contextlib.suppress(Exception):
            self._zeroconf.close()
