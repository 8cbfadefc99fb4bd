"""Announce this box: ``_kserve-v2._tcp`` (the API) and ``_http._tcp`` (the dashboard), with a short TXT
record in the style of ESPHome and Home Assistant; details stay behind GET /v2.

The records follow the box: they are updated when the number of ready models or the addresses change,
withdrawn (goodbye packets) on shutdown, and a name another box already uses becomes "name (2)".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections.abc import Callable, Iterable, Sequence

import psutil
from zeroconf import BadTypeInNameException, InterfaceChoice, IPVersion, NonUniqueNameException
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from appliance import __version__
from appliance.client.boxes import HTTP_TYPE, KSERVE_TYPE

__all__ = ["Announcer", "catalog_digest", "txt_record"]

log = logging.getLogger(__name__)


def txt_record(box_id: str, accelerators: Sequence[str], models: int, grpc_port: int | None = None,
               catalog: str | None = None, tls: Sequence[str] = ()) -> dict[str, str]:
    """Keys of at most 9 characters, a record well under 400 bytes (RFC 6763). ``grpc`` is the gRPC port
    when gRPC is served (the service's own port is the HTTP one); ``mset`` a digest of the ready models'
    names (see ``catalog_digest``), so that clients re-read the box's models when they change; ``tls`` the
    ports that speak TLS ("http", "grpc", comma-separated; absent: none)."""
    record = {"txtvers": "1", "id": box_id, "version": __version__, "api": "v2", "path": "/v2",
              "hw": ",".join(accelerators)[:60], "models": str(models)}
    if grpc_port is not None:
        record["grpc"] = str(grpc_port)
    if catalog is not None:
        record["mset"] = catalog
    if tls:
        record["tls"] = ",".join(tls)
    return record


def catalog_digest(names: Iterable[str]) -> str:
    """8 hex digits that change when the set of ready model names does."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:8]


def _lan_addresses(host: str, interfaces: Sequence[str]) -> list[str]:
    """The IPv4 addresses to announce: the restricted interfaces, the bound host, else every non-loopback."""
    if interfaces:
        return list(interfaces)
    if host not in ("", "0.0.0.0", "::"):
        return [host]
    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family == socket.AF_INET and not a.address.startswith("127.")]
    return sorted(set(found)) or ["127.0.0.1"]


class Announcer:
    def __init__(self, name: str, port: int, host: str, interfaces: Sequence[str], box_id: str,
                 accelerators: Callable[[], Sequence[str]], models: Callable[[], int],
                 grpc_port: int | None = None, catalog: Callable[[], str] | None = None,
                 tls: Sequence[str] = ()) -> None:
        """``catalog``: the digest of the ready models' names (``catalog_digest``), announced as ``mset``;
        ``tls``: the ports that speak TLS ("http", "grpc")."""
        self.name = name
        self._tls = tuple(tls)
        self._catalog = catalog
        self._grpc_port = grpc_port
        self._port = port
        self._host = host
        self._interfaces = list(interfaces)
        self._id = box_id
        self._accelerators = accelerators
        self._models = models
        self._zeroconf: AsyncZeroconf | None = None
        self._infos: list[AsyncServiceInfo] = []
        self._task: asyncio.Task | None = None
        self._state: tuple = ()

    def _info(self, service_type: str, instance: str, addresses: list[str],
              properties: dict[str, str]) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            service_type,
            f"{instance}.{service_type}",
            addresses=[socket.inet_aton(a) for a in addresses],
            port=self._port,
            properties=properties if service_type == KSERVE_TYPE else {**properties, "path": "/"},
            server=f"{socket.gethostname().split('.')[0]}-{self._id[:8]}.local.",
        )

    async def start(self) -> None:
        self._zeroconf = AsyncZeroconf(interfaces=self._interfaces or InterfaceChoice.All,
                                       ip_version=IPVersion.V4Only)
        addresses = _lan_addresses(self._host, self._interfaces)
        properties = txt_record(self._id, self._accelerators(), self._models(), self._grpc_port,
                                self._catalog() if self._catalog is not None else None, self._tls)
        self.name = await self._register_unique(addresses, properties)
        self._state = (tuple(addresses), tuple(sorted(properties.items())))
        self._task = asyncio.create_task(self._follow(), name="mdns-follow")
        log.info("announcing %r on mDNS (%s) at %s", self.name, KSERVE_TYPE, ", ".join(addresses))

    async def _register_unique(self, addresses: list[str], properties: dict[str, str]) -> str:
        """Register both services under the first free name: name, name (2), name (3), ..."""
        assert self._zeroconf is not None
        for number in range(1, 100):
            instance = self.name if number == 1 else f"{self.name} ({number})"
            # Ask first: zeroconf's own probing only sees answers that arrive within its probe
            # window, which a busy box on the LAN can miss.
            if await self._zeroconf.async_get_service_info(KSERVE_TYPE, f"{instance}.{KSERVE_TYPE}", timeout=1500):
                log.info("mDNS name %r is taken on this network; trying the next one", instance)
                continue
            infos = [self._info(t, instance, addresses, properties) for t in (KSERVE_TYPE, HTTP_TYPE)]
            try:
                for info in infos:
                    await self._zeroconf.async_register_service(info, allow_name_change=False)
            except NonUniqueNameException:
                for info in infos:
                    with contextlib.suppress(Exception):
                        await self._zeroconf.async_unregister_service(info)
                log.info("mDNS name %r is taken on this network; trying the next one", instance)
                continue
            except BadTypeInNameException as exc:
                raise ValueError(f"cannot announce the name {instance!r}: {exc}") from exc
            self._infos = infos
            return instance
        raise RuntimeError(f"no free mDNS name for {self.name!r}")

    async def _follow(self) -> None:
        """Re-announce when the ready-model count, accelerators or addresses change."""
        while True:
            await asyncio.sleep(1.0)
            addresses = _lan_addresses(self._host, self._interfaces)
            properties = txt_record(self._id, self._accelerators(), self._models(), self._grpc_port,
                                self._catalog() if self._catalog is not None else None, self._tls)
            state = (tuple(addresses), tuple(sorted(properties.items())))
            if state == self._state or self._zeroconf is None:
                continue
            self._state = state
            instance = self._infos[0].name[: -len(KSERVE_TYPE) - 1]
            self._infos = [self._info(t, instance, addresses, properties) for t in (KSERVE_TYPE, HTTP_TYPE)]
            for info in self._infos:
                await self._zeroconf.async_update_service(info)
            log.info("mDNS record updated: models=%s addresses=%s", properties["models"], ", ".join(addresses))

    async def stop(self) -> None:
        """Send goodbyes and close (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._zeroconf is not None:
            zeroconf, self._zeroconf = self._zeroconf, None
            await zeroconf.async_unregister_all_services()
            await zeroconf.async_close()
            log.info("mDNS records withdrawn")
