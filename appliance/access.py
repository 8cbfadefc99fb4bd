"""Who needs the bearer token, free of any transport: the exempt networks and the token comparison that
REST (``Authorization`` header) and gRPC (``authorization`` metadata) both apply."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

from appliance.errors import Unauthorized

__all__ = ["Network", "address_in", "check_bearer", "parse_networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(networks: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in networks)


def address_in(address: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether ``address`` (an IP literal, maybe with an IPv6 zone) lies in one of ``networks``; junk and
    None (a UNIX socket peer) lie in none."""
    if not address:
        return False
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    return any(parsed in network for network in networks)


def check_bearer(value: str | None, token: str, how: str) -> None:
    """Raise ``Unauthorized`` unless ``value`` is ``Bearer <token>`` (compared in constant time; an empty
    bearer never matches). ``how`` tells the client where the token goes."""
    scheme, _, given = (value or "").partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized(
            f"this endpoint needs {how} from this address; the token is in <state-dir>/auth-token on the "
            "appliance (or the auth_token setting)"
        )
