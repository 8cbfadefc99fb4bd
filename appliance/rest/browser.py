"""What a web page open in a browser on the box (or on the LAN) must not be able to make the daemon do.

Loopback clients need no token, so a hostile page that gets a browser on the box to send requests
would act with loopback's rights. Two ways in are closed here:

- DNS rebinding: a page on ``evil.example`` re-resolves its own name to 127.0.0.1 and then reads the
  daemon as if same-origin. Its requests carry ``Host: evil.example``, so every request must name this
  box: an IP literal, ``localhost``, the hostname, its mDNS names, or a name the ``allowed_hosts``
  setting lists.
- Cross-site request forgery: a page can send a POST to any address without a CORS preflight when its
  content type is ``text/plain``, a form encoding or multipart (the CORS-safelisted types); any other
  type (``application/json``, the ``application/octet-stream`` tritonclient.http.aio sends) makes the
  browser ask first, and this server answers no preflight. Control endpoints, and inference requests
  that name a shared-memory region, refuse requests whose ``Origin`` is another site or whose
  ``Sec-Fetch-Site`` says cross-site or same-site, ``text/plain`` and multipart bodies always, and form
  bodies (``application/x-www-form-urlencoded``) when a browser sent them (``browser_refusal``).

A browser is told apart by what every current browser adds to a POST a page makes, and programs do not:
``Origin`` (Chromium, Firefox and Safari send it on every POST, forms included) and the Fetch metadata
(``Sec-Fetch-Site``, ``-Mode``, ``-Dest``, ``-User``), or ``Upgrade-Insecure-Requests`` on a navigation.
libcurl's default form type is how Triton's own perf_analyzer (``-i http --shared-memory system``) sends
its JSON bodies, with none of those headers, so it is served.
"""

from __future__ import annotations

from collections.abc import Mapping

from appliance.core.errors import ApplianceError, Forbidden, UnsupportedMediaType
from appliance.rest.rest_config import HostPolicy

__all__ = ["browser_refusal", "check_host"]

# What a page may make a browser send anywhere without a CORS preflight (the Fetch standard's
# CORS-safelisted request Content-Types). The form type is also libcurl's default (perf_analyzer's).
_SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
_FORM = "application/x-www-form-urlencoded"
_BROWSER_MARKS = ("Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Sec-Fetch-User",
                  "Upgrade-Insecure-Requests")
"""Headers a browser adds to the POSTs a page makes (one at least, in every current browser)."""


def check_host(headers: Mapping[str, str], policy: HostPolicy) -> None:
    """Refuse a request whose ``Host`` (``headers``: the request's, case-insensitive) names another site."""
    host = headers.get("Host")
    if host is not None and not policy.allows(host):
        raise Forbidden(
            f"Host {host[:100]!r} does not name this appliance (a DNS-rebinding page sends such requests); "
            "use its IP address or hostname, or add the name to the allowed_hosts setting "
            "(APPLIANCE_ALLOWED_HOSTS)"
        )


def browser_refusal(headers: Mapping[str, str]) -> ApplianceError | None:
    """The error for a request with ``headers`` (case-insensitive) where the browser rules apply, if a
    page of another site may have sent it; None when nothing says so."""
    fetch_site = headers.get("Sec-Fetch-Site", "").lower()
    if fetch_site in ("cross-site", "same-site"):
        return Forbidden(f"control endpoints and shared memory refuse requests from other sites (Sec-Fetch-Site: "
                         f"{fetch_site})")
    origin = headers.get("Origin")
    if origin is not None and not _same_origin(origin, headers.get("Host")):
        return Forbidden(
            f"control endpoints and shared memory refuse requests from other origins (Origin: {origin[:100]!r}); "
            "call them from a program, not a web page"
        )
    content_type = headers.get("Content-Type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media in _SIMPLE_TYPES and (media != _FORM or any(mark in headers for mark in _BROWSER_MARKS)):
            return UnsupportedMediaType(
                f"control endpoints and shared memory refuse Content-Type {media[:60]!r}, which any web page can "
                "send; send 'Content-Type: application/json' (or application/octet-stream, or none)"
            )
    return None


def _same_origin(origin: str, host: str | None) -> bool:
    if host is None or origin == "null":
        return False
    return origin.lower().rstrip("/") in (f"http://{host.lower()}", f"https://{host.lower()}")
