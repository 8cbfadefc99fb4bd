"""The one place errors become HTTP: ``{"error": "..."}`` with the status the error class carries."""

from __future__ import annotations

import logging
from http import HTTPStatus

import orjson
from aiohttp import web

from appliance.core.errors import ApplianceError, internal_message
from appliance.rest.http_basics import error_parts, too_large
from appliance.rest.keys import CONFIG

__all__ = ["error_middleware", "error_response"]

log = logging.getLogger(__name__)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"error": message}),
        content_type="application/json",
        headers=headers,
    )


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
