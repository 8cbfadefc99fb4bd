"""What the REST front end is configured with, free of aiohttp: built by ``appliance.composition`` from
the settings' ``http`` section."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from pathlib import Path

from appliance.protocol.admission import Network
from appliance.protocol.inflate import DEFAULT_RATIO
from appliance.tls.context import ServerTls

__all__ = ["BodyLimits", "HostPolicy", "RestConfig", "host_policy"]

_PORT = re.compile(r":[0-9]{1,5}$")


@dataclasses.dataclass(frozen=True, slots=True)
class BodyLimits:
    max_bytes: int
    """Largest body, as sent and as decompressed (max_request_bytes)."""
    read_timeout: float
    """Seconds to wait for each next piece of the body (body_timeout)."""
    max_inflation_ratio: int = DEFAULT_RATIO
    """The most a compressed body may inflate to, as a multiple of its size (max_inflation_ratio; 0: none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which ``Host`` names address this box (IP literals always do)."""

    names: frozenset[str]
    suffixes: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    any_host: bool = False

    def allows(self, host: str | None) -> bool:
        if host is None or self.any_host:
            return True  # HTTP/1.0 clients may send none; browsers always do
        return _allows(self, host)

    def _judge(self, host: str) -> bool:
        name = _strip_port(host.strip()).lower().rstrip(".")
        if _is_ip_literal(name):
            return True
        if name == "localhost" or name.endswith(".localhost") or name in self.names:
            return True
        return any(name.endswith(s) or name == s[1:] for s in self.suffixes) or any(
            p.fullmatch(name) for p in self.patterns
        )


@functools.lru_cache(maxsize=256)
def _allows(policy: HostPolicy, host: str) -> bool:
    """Every request carries a Host, nearly always one of a few: judged once each (bounded: names an
    attacker invents only churn the cache)."""
    return policy._judge(host)


def host_policy(allowed_hosts: Iterable[str], box_name: str | None = None) -> HostPolicy:
    """The names this box answers to: its hostname (short and as set), ``<hostname>.local``, the mDNS
    host name ``<hostname>-<id>.local``, ``<box name>.local``, and ``allowed_hosts`` (exact names,
    ``.example.com`` for a domain and its subdomains, ``*`` for any)."""
    hostname = socket.gethostname().lower().rstrip(".")
    short = hostname.split(".")[0]
    names = {hostname, short, f"{short}.local"}
    if box_name:
        names |= {box_name.lower(), f"{box_name.lower()}.local"}
    extra = [h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()]
    return HostPolicy(
        names=frozenset(names | {h for h in extra if not h.startswith(".") and h != "*"}),
        suffixes=tuple(h for h in extra if h.startswith(".")),
        patterns=(re.compile(re.escape(short) + r"-[0-9a-f]{8}\.local"),),
        any_host="*" in extra,
    )


def _strip_port(host: str) -> str:
    if host.startswith("["):  # [v6]:port
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return _PORT.sub("", host)
    return host


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class RestConfig:
    body: BodyLimits
    """Request bodies: the largest (max_request_bytes) and the wait for each piece (body_timeout)."""
    hosts: HostPolicy = HostPolicy(frozenset(), any_host=True)
    """The names a request's Host may give (allowed_hosts and the box's own names)."""
    trusted_proxies: tuple[Network, ...] = ()
    """Reverse proxies whose X-Forwarded-For names the real client."""
    history: Path | None = None
    """The metrics history database /v2/history reads; None when metrics are off."""
    history_read_only: bool = False
    """Read the history without writing (a read-only state dir)."""
    tls: ServerTls | None = None
    """TLS on the HTTP and metrics ports (http_use_ssl), None: plain HTTP."""
