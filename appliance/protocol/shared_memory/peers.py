"""Which clients are on this host, for ``client_shm = local``.

A client is local when its address is in ``shm_local_networks`` (loopback by default: no packet
from another machine carries a loopback source, the kernel drops those as martians), or when it
connected *from* the very address it connected *to*, which only a process on this host can do (a
camera pipeline on the box that talks to the box's LAN address). Behind a trusted reverse proxy the
front end passes the forwarded client's address and no connection address: the proxy's own
locality says nothing about the client's.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable

import psutil

__all__ = ["LocalPeers"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse(address: str | None) -> Address | None:
    if not address:
        return None
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None  # a UNIX socket peer, or junk
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped  # ::ffff:127.0.0.1 on a dual-stack socket is 127.0.0.1
    return parsed


class LocalPeers:
    def __init__(self, networks: Iterable[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    def contains(self, client: str | None, connected_to: str | None = None) -> bool:
        """``client``: the client's address; ``connected_to``: the address its connection reached on
        this host (None when the client's address came from a proxy's X-Forwarded-For)."""
        address = _parse(client)
        if address is None:
            return False
        if any(address in network for network in self.networks):
            return True
        return connected_to is not None and address == _parse(connected_to)

    def is_local(self, client: str | None, connected_to: str | None, *, direct: bool) -> bool:
        """``contains``, for a transport that may not know which local address a connection reached
        (grpc.aio does not say): a direct peer with an address of this host is on this host all the same,
        since no other machine can complete a TCP handshake from it."""
        if connected_to is None and direct and client is not None and client.split("%")[0] in _host_addresses():
            connected_to = client
        return self.contains(client, connected_to)


_HOST_ADDRESSES_TTL = 5.0
_host_cache: tuple[float, frozenset[str]] = (-_HOST_ADDRESSES_TTL, frozenset())


def _host_addresses() -> frozenset[str]:
    """This host's own addresses (read again every few seconds: interfaces come and go)."""
    global _host_cache
    read_at, addresses = _host_cache
    now = time.monotonic()
    if now - read_at >= _HOST_ADDRESSES_TTL:
        addresses = frozenset(a.address.split("%")[0] for found in psutil.net_if_addrs().values() for a in found
                              if a.family in (socket.AF_INET, socket.AF_INET6))
        _host_cache = (now, addresses)
    return addresses
