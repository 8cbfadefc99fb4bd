"""What a web page open in a browser on the box (or on the LAN) must not be able to make the daemon do.

Loopback clients need no token, so a hostile page that gets a browser on the box to send requests
would act with loopback's rights. Two ways in are closed here:

- DNS rebinding: a page on ``evil.example`` re-resolves its own name to 127.0.0.1 and then reads the
  daemon as if same-origin. Its requests carry ``Host: evil.example``, so every request must name this
  box: an IP literal, ``localhost``, the hostname, its mDNS names, or a name the ``allowed_hosts``
  setting lists.
- Cross-site request forgery: a page can send a POST to any address without a CORS preflight when its
  content type is ``text/plain`` or a form encoding. Control endpoints accept only a JSON body (or no
  Content-Type at all, as tritonclient sends) and refuse requests whose ``Origin`` is another site or
  whose ``Sec-Fetch-Site`` says cross-site or same-site.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import socket
from collections.abc import Iterable

from aiohttp import web

from appliance.errors import Forbidden, UnsupportedMediaType

__all__ = ["HostPolicy", "check_control_request", "check_host", "host_policy"]

_PORT = re.compile(r":[0-9]{1,5}$")
_JSON_TYPES = ("application/json",)


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


def check_host(request: web.Request, policy: HostPolicy) -> None:
    host = request.headers.get("Host")
    if host is not None and not policy.allows(host):
        raise Forbidden(
            f"Host {host[:100]!r} does not name this appliance (a DNS-rebinding page sends such requests); "
            "use its IP address or hostname, or add the name to the allowed_hosts setting "
            "(APPLIANCE_ALLOWED_HOSTS)"
        )


def check_control_request(request: web.Request) -> None:
    """Refuse what a page on another site can make a browser send to a control endpoint."""
    fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
    if fetch_site in ("cross-site", "same-site"):
        raise Forbidden(f"control endpoints refuse requests from other sites (Sec-Fetch-Site: {fetch_site})")
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin, request):
        raise Forbidden(
            f"control endpoints refuse requests from other origins (Origin: {origin[:100]!r}); "
            "call them from a program, not a web page"
        )
    content_type = request.headers.get("Content-Type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in _JSON_TYPES:
            raise UnsupportedMediaType(
                f"control endpoints take a JSON body: send 'Content-Type: application/json' (or no "
                f"Content-Type), not {media[:60]!r}"
            )


def _same_origin(origin: str, request: web.Request) -> bool:
    host = request.headers.get("Host")
    if host is None or origin == "null":
        return False
    return origin.lower().rstrip("/") in (f"http://{host.lower()}", f"https://{host.lower()}")


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
