"""The one place errors become HTTP: ``{"error": "..."}`` with the status the error class carries."""

from __future__ import annotations

import logging
import math
from http import HTTPStatus

import orjson
from aiohttp import web

from appliance.core.errors import (
    ApplianceError,
    RequestTimeout,
    Unauthorized,
    Unavailable,
    UnsupportedEncoding,
)
from appliance.rest.body import too_large
from appliance.rest.keys import CONFIG

__all__ = ["error_middleware", "error_parts", "error_response", "internal_message"]

log = logging.getLogger(__name__)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"error": message}),
        content_type="application/json",
        headers=headers,
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


def internal_message(exc: Exception) -> str:
    """What a 500 says of an error no handler expected."""
    return f"internal error: {type(exc).__name__}: {exc}"


def _from_appliance(exc: ApplianceError) -> web.Response:
    return error_response(*error_parts(exc))


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApplianceError as exc:
        return _from_appliance(exc)
    except web.HTTPRequestEntityTooLarge:
        return _from_appliance(too_large(request.app[CONFIG].body.max_bytes))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == HTTPStatus.NOT_FOUND:
            message = f"Not Found: no route for {request.method} {request.path}; the API lives under /v2"
        elif exc.status == HTTPStatus.METHOD_NOT_ALLOWED:  # Triton's words first, as everywhere
            message = f"Method Not Allowed: {request.method} is not allowed on {request.path}"
        return error_response(exc.status, message, {k: v for k, v in exc.headers.items() if k == "Allow"})
    except Exception as exc:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, internal_message(exc))
