"""What every HTTP path of the daemon (aiohttp's routes and the infer lane) shares: the binary-tensor
header's name, the error a late or oversized body gets, how an error becomes a status, message and
headers, and a connection's addresses."""

from __future__ import annotations

import asyncio
import math

from appliance.core.errors import (
    ApplianceError,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    Unavailable,
    UnsupportedEncoding,
)

__all__ = ["HEADER_LENGTH", "body_timeout", "error_parts", "too_large", "transport_address"]

HEADER_LENGTH = "Inference-Header-Content-Length"


def body_timeout(timeout: float, received: int) -> RequestTimeout:
    return RequestTimeout(
        f"no part of the request body arrived for {timeout:g} s (after {received} bytes); send the "
        "body without pauses (the server's body_timeout setting)"
    )


def too_large(limit: int, size: int | None = None) -> PayloadTooLarge:
    """Triton's words first (its qa L0_http test_loading_large_invalid_model looks for them), then the fix."""
    of = f" of {size} bytes" if size is not None else ""
    return PayloadTooLarge(
        f"request JSON size{of} exceeds the maximum allowed input size. The request body is larger than the "
        f"{limit}-byte limit; send a smaller batch or raise the server's max_request_bytes setting "
        "(APPLIANCE_MAX_REQUEST_BYTES)"
    )


def error_parts(exc: ApplianceError) -> tuple[int, str, dict[str, str] | None]:
    """The status, message and extra headers ``exc`` is answered with over HTTP (aiohttp's routes and
    the infer lane alike)."""
    headers = None
    if isinstance(exc, Unavailable) and exc.retry_after is not None:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": 'Bearer realm="appliance"'}
    elif isinstance(exc, UnsupportedEncoding):
        headers = {"Accept-Encoding": ", ".join(exc.accepted)}  # RFC 7694
    elif isinstance(exc, RequestTimeout):
        headers = {"Connection": "close"}  # the rest of a stalled body is not waited for
    return exc.status, exc.message, headers


def transport_address(transport: asyncio.BaseTransport, which: str) -> str | None:
    """The IP address at one end of a connection (``which``: "peername" or "sockname"); None for a UNIX
    socket or a transport that does not say."""
    name = transport.get_extra_info(which)
    return name[0] if isinstance(name, tuple) and name else None
