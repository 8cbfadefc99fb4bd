"""Route handlers: parse the HTTP request, call the data plane, serialise the answer. Each route names
the data-plane operation it performs (``OPERATIONS``): what the admission middleware admits."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from appliance.core.errors import InvalidInput, NotFound, Unavailable
from appliance.dashboard import STATIC_DIR
from appliance.metrics.history import history
from appliance.protocol.inference import Target
from appliance.protocol.operations import Operation
from appliance.rest import shared_memory
from appliance.rest.body import read_body
from appliance.rest.codec import JsonTooDeep, encode_answer
from appliance.rest.error_middleware import error_response
from appliance.rest.generate import generate, generate_stream
from appliance.rest.http_basics import HEADER_LENGTH
from appliance.rest.infer_body import InferBody
from appliance.rest.jsonio import json_response as _json
from appliance.rest.jsonio import optional_json as _optional_json
from appliance.rest.keys import CONFIG, DATAPLANE, FLEET, METRICS
from appliance.rest.openapi import openapi_document
from appliance.rest.reads import answer_read
from appliance.rest.security import caller
from appliance.security.fleet_signature import NONCE_PATH

__all__ = ["OPERATIONS", "ROUTES"]


_MAX_UNIX_TIME = 1 << 36  # the year 4147: far enough, and SQLite's integers hold it
_MAX_VERSION = (1 << 63) - 1


def _target(request: web.Request) -> Target:
    return Target(*_model_args(request))


def _model_args(request: web.Request) -> tuple[str, str | None]:
    version = request.match_info.get("version")
    if version is not None and not (version.isascii() and version.isdigit()):
        # Triton's routes take only digits there: any other path is no route at all.
        raise NotFound(f"Not Found: no route for {request.method} {request.path}; a model version in the path is "
                       "a number (/v2/models/<model>/versions/<n>/...)")
    return request.match_info["model"], version


def _read(operation: Operation) -> Callable[[web.Request], Awaitable[web.Response]]:
    """aiohttp's handler for one of the reads the infer lane serves too (appliance.rest.reads)."""
    async def handler(request: web.Request) -> web.Response:
        name, version = _model_args(request) if "model" in request.match_info else ("", None)
        status, body, error = answer_read(request.app[DATAPLANE], operation, name, version)
        if error is not None:
            return error_response(status, error)
        return web.Response(status=status) if body is None else _json(body)
    handler.__name__ = operation.name.lower()
    return handler


server_live = _read(Operation.SERVER_LIVE)
server_ready = _read(Operation.SERVER_READY)
model_ready = _read(Operation.MODEL_READY)
model_metadata = _read(Operation.MODEL_METADATA)
model_config = _read(Operation.MODEL_CONFIG)


async def server_health(request: web.Request) -> web.Response:
    """Liveness, readiness and what is degraded in the state dir (read-only, a database moved aside...)."""
    return _json(request.app[DATAPLANE].health().as_json())


async def server_metadata(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].server_metadata().as_json())


async def infer(request: web.Request) -> web.Response:
    received_ns = time.monotonic_ns()  # the trace's REQUEST_START
    limits = request.app[CONFIG].body
    source = InferBody(functools.partial(_target, request), request.headers.get(HEADER_LENGTH),
                       functools.partial(read_body, request, limits=limits), request.headers)
    async with request.app[DATAPLANE].infer(caller(request), source, received_ns=received_ns) as result:
        payload, json_length = await encode_answer(result.response, result.request)
    if json_length is None:
        answer = web.Response(body=payload, content_type="application/json")
    else:
        answer = web.Response(body=payload, content_type="application/octet-stream",
                              headers={HEADER_LENGTH: str(json_length)})
    accepted = request.headers.get("Accept-Encoding")
    if accepted and ("gzip" in accepted or "deflate" in accepted):
        answer.enable_compression()
    return answer


async def model_statistics(request: web.Request) -> web.Response:
    rows = request.app[DATAPLANE].model_statistics(request.match_info.get("model"), request.match_info.get("version"))
    return _json({"model_stats": [row.as_json() for row in rows]})


async def model_selection(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_selection(*_model_args(request)))


async def prometheus_metrics(request: web.Request) -> web.Response:
    metrics = request.app.get(METRICS)
    if metrics is None:
        raise Unavailable("metrics are switched off (settings: metrics = false)")
    body = await asyncio.to_thread(metrics.prometheus)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _query_int(request: web.Request, name: str, default: int | None, low: int, high: int) -> int | None:
    """A numeric query parameter (``1e9`` and ``1.5`` allowed, truncated) within [low, high]."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw[:40])
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN and infinities fail too
        raise InvalidInput(f"query parameter {name!r} must be a number from {low} to {high}, got {raw[:40]!r}")
    return int(value)


async def metrics_history(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    if config.history is None:
        raise Unavailable("metrics are switched off (settings: metrics = false): there is no history")
    now = int(time.time())
    until = _query_int(request, "until", now + 1, 0, _MAX_UNIX_TIME)
    since = _query_int(request, "since", (until or now) - 3600, 0, _MAX_UNIX_TIME)
    step = _query_int(request, "step", 5, 1, _MAX_UNIX_TIME)
    assert since is not None and until is not None and step is not None
    model = request.query.get("model") or None
    version = _query_int(request, "version", None, 1, _MAX_VERSION)
    try:
        result = await asyncio.to_thread(history, config.history, since, until, step, model, version,
                                         config.history_read_only)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return _json(result)


async def hardware(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].hardware())


async def model_memory(request: web.Request) -> web.Response:
    """What each loaded model holds and why, the model memory budget (docs/memory.md; the dashboard's)."""
    return _json(request.app[DATAPLANE].memory())


async def fleet(request: web.Request) -> web.Response:
    """The boxes this one sees on the LAN (the dashboard's fleet panel)."""
    return _json(request.app[FLEET].as_json())


async def fleet_nonce(request: web.Request) -> web.Response:
    """This box's id and a nonce for one signed request (appliance.security.fleet_signature); needs no token."""
    response = _json(request.app[DATAPLANE].fleet_nonce())
    response.headers["Cache-Control"] = "no-store"
    return response


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document())


async def dashboard(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def _control_parameters(request: web.Request, example: str) -> dict:
    """A load's or unload's ``parameters`` object (``example``: what the body looks like)."""
    body = await _optional_json(request, f'a JSON object such as {{"parameters": {example}}}')
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    return parameters


async def load_model(request: web.Request) -> web.Response:
    parameters = await _control_parameters(request, '{"config": "..."}')
    await request.app[DATAPLANE].load_model(request.match_info["model"], parameters)
    return web.Response(status=200)


async def unload_model(request: web.Request) -> web.Response:
    parameters = await _control_parameters(request, '{"unload_dependents": false}')
    await request.app[DATAPLANE].unload_model(request.match_info["model"], parameters)
    return web.Response(status=200)


async def repository_index(request: web.Request) -> web.Response:
    # Triton's words: 2.51's, then its later releases' (qa L0_http test_repository_index_deeply_nested_json
    # sends a "ready" nested 250000 levels deep, which no JSON parser here reads: not a boolean either).
    words = ("attempt to access JSON non-boolean as boolean: Invalid value for 'ready': expected a boolean (true "
             'or false, as in {"ready": true})')
    try:
        body = await _optional_json(request, 'a JSON object such as {"ready": true}')
    except JsonTooDeep as exc:
        raise InvalidInput(f"{words}; {exc.message}") from None
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInput(words)
    rows = request.app[DATAPLANE].repository_index(ready)
    return _json([row.as_json() for row in rows])


async def trace_setting(request: web.Request) -> web.Response:
    """Triton's trace extension: GET answers the settings in force (global, or the model's)."""
    return _trace_answer(request.app[DATAPLANE].trace_settings(request.match_info.get("model")))


async def change_trace_setting(request: web.Request) -> web.Response:
    """POST changes them ({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}; null clears one) and answers
    the result (a control operation)."""
    model = request.match_info.get("model")
    body = await _optional_json(request, 'a JSON object such as {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}')
    changes = {key: _setting_values(key, value) for key, value in body.items()}
    return _trace_answer(request.app[DATAPLANE].trace_settings(model, changes))


def _trace_answer(values: dict[str, list[str]]) -> web.Response:
    # As Triton answers over HTTP: the level as a list, every other setting as one string.
    return _json({key: value if key == "trace_level" else (value[0] if value else "") for key, value in values.items()})


def _setting_values(key: str, value: object) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in items):  # Triton's JSON reader takes strings only
        raise InvalidInput(f"trace setting {key[:80]!r} must be a string, a list of strings or null (e.g. \"1\")")
    return [str(item) for item in items]


async def log_settings(request: web.Request) -> web.Response:
    """Triton's logging extension: the daemon's log settings."""
    return _json(request.app[DATAPLANE].log_settings())


async def update_log_settings(request: web.Request) -> web.Response:
    """Change the daemon's log settings at once (a control endpoint); answers the settings now."""
    changes = await _optional_json(request, 'a JSON object such as {"log_verbose_level": 1}')
    return _json(request.app[DATAPLANE].log_settings(changes))


_Route = tuple[str, str, Callable, Operation]
"""Method, path, handler and the data-plane operation it performs."""

_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"


def _model_routes(*routes: _Route) -> list[_Route]:
    """Each of ``routes`` (its path: what follows the model's) under a model and under one of its versions."""
    return [(method, prefix + path, handler, operation)
            for method, path, handler, operation in routes for prefix in (_MODEL, _VERSION)]


_ROUTES: list[_Route] = [
    # Inference first: aiohttp tries the routes under /v2 in this order, a pattern match each.
    *_model_routes(
        ("POST", "/infer", infer, Operation.INFER),
        ("POST", "/generate", generate, Operation.INFER),
        ("POST", "/generate_stream", generate_stream, Operation.INFER_STREAM),
    ),
    ("GET", "/", dashboard, Operation.DOCUMENTS),
    ("GET", "/metrics", prometheus_metrics, Operation.METRICS),
    ("GET", "/v2/history", metrics_history, Operation.HISTORY),
    ("GET", "/v2/probe", hardware, Operation.HARDWARE),
    ("GET", "/v2/fleet", fleet, Operation.FLEET),
    ("GET", "/v2/memory", model_memory, Operation.MODEL_MEMORY),
    ("GET", NONCE_PATH, fleet_nonce, Operation.FLEET_NONCE),
    ("GET", "/v2/openapi.json", openapi, Operation.DOCUMENTS),
    ("GET", "/v2/health", server_health, Operation.SERVER_HEALTH),
    ("GET", "/v2/logging", log_settings, Operation.LOG_SETTINGS),
    ("POST", "/v2/logging", update_log_settings, Operation.LOG_UPDATE),
    ("GET", "/v2/health/live", server_live, Operation.SERVER_LIVE),
    ("GET", "/v2/health/ready", server_ready, Operation.SERVER_READY),
    ("GET", "/v2", server_metadata, Operation.SERVER_METADATA),
    ("POST", "/v2/repository/index", repository_index, Operation.REPOSITORY_INDEX),
    ("POST", "/v2/repository/models/{model}/load", load_model, Operation.MODEL_LOAD),
    ("POST", "/v2/repository/models/{model}/unload", unload_model, Operation.MODEL_UNLOAD),
    ("GET", "/v2/models/stats", model_statistics, Operation.MODEL_STATISTICS),
    ("GET", "/v2/trace/setting", trace_setting, Operation.TRACE_SETTINGS),
    ("GET", _MODEL + "/trace/setting", trace_setting, Operation.TRACE_SETTINGS),
    ("POST", "/v2/trace/setting", change_trace_setting, Operation.TRACE_UPDATE),
    ("POST", _MODEL + "/trace/setting", change_trace_setting, Operation.TRACE_UPDATE),
    *_model_routes(
        ("GET", "", model_metadata, Operation.MODEL_METADATA),
        ("GET", "/ready", model_ready, Operation.MODEL_READY),
        ("GET", "/config", model_config, Operation.MODEL_CONFIG),
        ("GET", "/stats", model_statistics, Operation.MODEL_STATISTICS),
        ("GET", "/selection", model_selection, Operation.MODEL_SELECTION),
    ),
    *shared_memory.ROUTES,
]


def _route_defs() -> list[web.AbstractRouteDef]:
    """aiohttp's routes, in the table's order, with the dashboard's files served right after its page."""
    defs: list[web.AbstractRouteDef] = []
    for method, path, handler, _ in _ROUTES:
        defs.append(web.route(method, path, handler))
        if handler is dashboard:
            defs.append(web.static("/dashboard/static", STATIC_DIR))
    return defs


ROUTES = _route_defs()
OPERATIONS = {handler: operation for _, _, handler, operation in _ROUTES}
"""The data-plane operation each handler performs (one operation per handler)."""
