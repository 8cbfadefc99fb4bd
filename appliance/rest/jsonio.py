"""JSON in and out of handlers: a response from any JSON-able value, and a small control body."""

from __future__ import annotations

import orjson
from aiohttp import web

from appliance.rest.body import read_body
from appliance.rest.codec import parse_json_object
from appliance.rest.keys import CONFIG, DATAPLANE

__all__ = ["json_response", "optional_json"]


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def optional_json(request: web.Request, expected: str) -> dict:
    """The body as a JSON object (``expected`` describes it in errors); an absent or blank body is ``{}``."""
    if not request.can_read_body:
        return {}
    with request.app[DATAPLANE].account() as account:
        raw = await read_body(request, account, request.app[CONFIG].body)
        return parse_json_object(raw, expected) if raw.strip() else {}
