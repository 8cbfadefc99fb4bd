"""Route handlers: parse the HTTP request, call the data plane, serialise the answer."""

from __future__ import annotations

import asyncio
import functools
import math
import re
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from appliance.budget import Account
from appliance.dashboard import STATIC_DIR
from appliance.engine.model import ModelVersion
from appliance.engine.types import InferRequest
from appliance.errors import InvalidInput
from appliance.fleet_signature import NONCE_PATH, NONCE_TTL, SCHEME
from appliance.metrics.history import history
from appliance.rest import shared_memory
from appliance.rest.body import read_body
from appliance.rest.codec import (
    HEADER_LENGTH,
    DecodeLimits,
    decode_infer_request,
    decode_raw_request,
    encode_infer_response,
)
from appliance.rest.error_middleware import error_response
from appliance.rest.generate import generate, generate_stream
from appliance.rest.jsonio import json_response as _json
from appliance.rest.jsonio import optional_json as _optional_json
from appliance.rest.keys import (
    BODY_LIMITS,
    BUDGET,
    DATAPLANE,
    FLEET,
    LIMITS,
    LOGS,
    METRICS,
    SETTINGS,
    SIGNATURES,
    STATE,
    TRACES,
)
from appliance.rest.openapi import openapi_document

__all__ = ["CONTROL_HANDLERS", "OPEN_HANDLERS", "ROUTES", "UNLIMITED_HANDLERS"]

_DIGITS = re.compile(r"[0-9]{1,15}")  # ASCII only: str.isdigit() also takes '²'
_MAX_UNIX_TIME = 1 << 36  # the year 4147: far enough, and SQLite's integers hold it
_MAX_VERSION = (1 << 63) - 1
# JSON (or BYTES tensors) above this is decoded on a worker thread so that it never stalls the event loop.
_DECODE_OFF_LOOP_BYTES = 1 << 20


def _model_args(request: web.Request) -> tuple[str, str | None]:
    return request.match_info["model"], request.match_info.get("version")


async def server_live(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[DATAPLANE].live() else 503)


async def server_ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[DATAPLANE].ready() else 503)


async def server_health(request: web.Request) -> web.Response:
    """Liveness, readiness and what is degraded in the state dir (read-only, a database moved aside...)."""
    dataplane = request.app[DATAPLANE]
    details = {"live": dataplane.live(), "ready": dataplane.ready(), "state": request.app[STATE].to_json()}
    if dataplane.failure is not None:
        details["failure"] = dataplane.failure
    return _json(details)


async def server_metadata(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_metadata(*_model_args(request)))


async def model_ready(request: web.Request) -> web.Response:
    name, version = _model_args(request)
    dataplane = request.app[DATAPLANE]
    if dataplane.model_ready(name, version):
        return web.Response(status=200)
    return error_response(503, f"model '{name}' is not ready")


async def model_config(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_config(*_model_args(request)))


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw.strip()):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer of at most 15 digits, got {raw[:40]!r}")
    return int(raw)


async def _read_body(request: web.Request, account: Account) -> bytes:
    return await read_body(request, account, request.app[BODY_LIMITS])


async def infer(request: web.Request) -> web.Response:
    received_ns = time.monotonic_ns()  # the trace's REQUEST_START
    dataplane = request.app[DATAPLANE]
    # Looked up (404/503) before the body is read, and held until the response: a reload or unload
    # lets this request finish on the version it started with.
    # The request's bytes in memory (body, decoded tensors) count against the budget until it answers.
    with dataplane.model(*_model_args(request)).in_use() as model, request.app[BUDGET].account() as account:
        return await _infer(request, model, account, received_ns)


def _decode_raw(body: bytes, model: ModelVersion, limits: DecodeLimits,
                reserve: Callable[[int], None]) -> InferRequest:
    """A raw binary request: the body is the model's only input (Triton's binary data extension)."""
    signature = model.signature
    if len(signature.inputs) != 1:
        raise InvalidInput(
            f"a raw binary request ({HEADER_LENGTH}: 0) needs a model with exactly one input; model "
            f"'{model.name}' has {len(signature.inputs)}: send a JSON header instead"
        )
    (spec,) = signature.inputs.values()
    shape = (1, *spec.dims) if signature.batched else tuple(spec.dims)
    return decode_raw_request(body, spec.name, spec.datatype, shape, limits, reserve)


def _decode_off_loop(body: bytes, header_length: int | None) -> bool:
    """Whether decoding costs more than the trip to a worker thread: a big JSON document does; binary
    fixed-size tensors are views of the body whatever their size (only BYTES ones are parsed)."""
    if header_length is None or header_length >= len(body):
        return len(body) > _DECODE_OFF_LOOP_BYTES
    if header_length > _DECODE_OFF_LOOP_BYTES:
        return True
    return len(body) > _DECODE_OFF_LOOP_BYTES and (header_length == 0 or b'"BYTES"' in body[:header_length])


async def _infer(request: web.Request, model: ModelVersion, account: Account, received_ns: int) -> web.Response:
    if model.decoupled:
        raise InvalidInput(
            "HTTP end point doesn't support models with decoupled transaction policy; call model "
            f"'{model.name}' through POST .../generate_stream (or gRPC ModelStreamInfer), which returns all its "
            "responses"
        )
    header_length = _header_length(request)
    body = await _read_body(request, account)
    limits = request.app[LIMITS]
    if header_length == 0:
        decode = functools.partial(_decode_raw, model=model)
    else:
        decode = functools.partial(decode_infer_request, header_length=header_length)
    if _decode_off_loop(body, header_length):
        decoded: InferRequest = await asyncio.to_thread(decode, body, limits=limits, reserve=account.reserve)
    else:
        decoded = decode(body, limits=limits, reserve=account.reserve)
    local = shared_memory.is_local_client(request) if decoded.uses_shared_memory else False
    response = await request.app[DATAPLANE].infer(model, decoded, local=local, reserve=account.reserve,
                                                  received_ns=received_ns)
    payload, json_length = encode_infer_response(response, decoded)
    if json_length is None:
        result = web.Response(body=payload, content_type="application/json")
    else:
        result = web.Response(
            body=payload,
            content_type="application/octet-stream",
            headers={HEADER_LENGTH: str(json_length)},
        )
    accepted = request.headers.get("Accept-Encoding")
    if accepted and ("gzip" in accepted or "deflate" in accepted):
        result.enable_compression()
    return result


async def model_statistics(request: web.Request) -> web.Response:
    name = request.match_info.get("model")
    return _json(request.app[DATAPLANE].model_statistics(name, request.match_info.get("version")))


async def model_selection(request: web.Request) -> web.Response:
    return _json(request.app[DATAPLANE].model_selection(*_model_args(request)))


async def prometheus_metrics(request: web.Request) -> web.Response:
    metrics = request.app.get(METRICS)
    if metrics is None:
        return error_response(503, "metrics are switched off (settings: metrics = false)")
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
    settings = request.app[SETTINGS]
    now = int(time.time())
    until = _query_int(request, "until", now + 1, 0, _MAX_UNIX_TIME)
    since = _query_int(request, "since", (until or now) - 3600, 0, _MAX_UNIX_TIME)
    step = _query_int(request, "step", 5, 1, _MAX_UNIX_TIME)
    assert since is not None and until is not None and step is not None
    model = request.query.get("model") or None
    version = _query_int(request, "version", None, 1, _MAX_VERSION)
    try:
        result = await asyncio.to_thread(history, settings.metrics_db, since, until, step, model, version,
                                         not request.app[STATE].writable)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return _json(result)


async def hardware(request: web.Request) -> web.Response:
    report = request.app[DATAPLANE].hardware
    if report is None:
        return error_response(503, "the hardware probe is still running; try again in a few seconds")
    return _json(report)


async def fleet(request: web.Request) -> web.Response:
    """The boxes this one sees on the LAN (the dashboard's fleet panel)."""
    return _json(request.app[FLEET].as_json())


async def fleet_nonce(request: web.Request) -> web.Response:
    """A nonce for one signed request (appliance.fleet_signature), and this box's id; needs no token."""
    signatures = request.app[SIGNATURES]
    response = _json({"id": signatures.box_id, "nonce": signatures.nonce(), "expires_in": NONCE_TTL, "scheme": SCHEME})
    response.headers["Cache-Control"] = "no-store"
    return response


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document())


async def dashboard(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def load_model(request: web.Request) -> web.Response:
    body = await _optional_json(request, 'a JSON object such as {"parameters": {"config": "..."}}')
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    await request.app[DATAPLANE].load_model(request.match_info["model"], parameters)
    return web.Response(status=200)


async def unload_model(request: web.Request) -> web.Response:
    body = await _optional_json(request, 'a JSON object such as {"parameters": {"unload_dependents": false}}')
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    await request.app[DATAPLANE].unload_model(request.match_info["model"], parameters)
    return web.Response(status=200)


async def repository_index(request: web.Request) -> web.Response:
    body = await _optional_json(request, 'a JSON object such as {"ready": true}')
    return _json(request.app[DATAPLANE].repository_index(bool(body.get("ready", False))))


async def trace_setting(request: web.Request) -> web.Response:
    """Triton's trace extension: GET answers the settings in force (global, or the model's); POST changes
    them ({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}; null clears one) and answers the result."""
    model = request.match_info.get("model")
    if model is not None:
        request.app[DATAPLANE].registry.entry(model)  # 404 for a model the repository does not have
    traces = request.app[TRACES]
    if request.method == "POST":
        body = await _optional_json(request, 'a JSON object such as {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}')
        values = traces.update({key: _setting_values(key, value) for key, value in body.items()}, model)
    else:
        values = traces.get(model)
    # As Triton answers over HTTP: the level as a list, every other setting as one string.
    return _json({key: value if key == "trace_level" else (value[0] if value else "") for key, value in values.items()})


async def change_trace_setting(request: web.Request) -> web.Response:
    """The POST of trace_setting, its own handler so that changing settings is a control action."""
    return await trace_setting(request)


def _setting_values(key: str, value: object) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, (str, int)) and not isinstance(item, bool) for item in items):
        raise InvalidInput(f"trace setting {key[:80]!r} must be a string, a list of strings or null")
    return [str(item) for item in items]


_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"

async def log_settings(request: web.Request) -> web.Response:
    """Triton's logging extension: the daemon's log settings."""
    return _json(request.app[LOGS].get())


async def update_log_settings(request: web.Request) -> web.Response:
    """Change the daemon's log settings at once (a control endpoint); answers the settings now."""
    changes = await _optional_json(request, 'a JSON object such as {"log_verbose_level": 1}')
    return _json(request.app[LOGS].update(changes))


ROUTES = [
    # Inference first: aiohttp tries the routes under /v2 in this order, a pattern match each.
    web.post(_MODEL + "/infer", infer),
    web.post(_VERSION + "/infer", infer),
    web.post(_MODEL + "/generate", generate),
    web.post(_VERSION + "/generate", generate),
    web.post(_MODEL + "/generate_stream", generate_stream),
    web.post(_VERSION + "/generate_stream", generate_stream),
    web.get("/", dashboard),
    web.static("/dashboard/static", STATIC_DIR),
    web.get("/metrics", prometheus_metrics),
    web.get("/v2/history", metrics_history),
    web.get("/v2/probe", hardware),
    web.get("/v2/fleet", fleet),
    web.get(NONCE_PATH, fleet_nonce),
    web.get("/v2/openapi.json", openapi),
    web.get("/v2/health", server_health),
    web.get("/v2/logging", log_settings),
    web.post("/v2/logging", update_log_settings),
    web.get("/v2/health/live", server_live),
    web.get("/v2/health/ready", server_ready),
    web.get("/v2", server_metadata),
    web.post("/v2/repository/index", repository_index),
    web.post("/v2/repository/models/{model}/load", load_model),
    web.post("/v2/repository/models/{model}/unload", unload_model),
    web.get("/v2/models/stats", model_statistics),
    web.get("/v2/trace/setting", trace_setting),
    web.get(_MODEL + "/trace/setting", trace_setting),
    web.post("/v2/trace/setting", change_trace_setting),
    web.post(_MODEL + "/trace/setting", change_trace_setting),
    *(
        route
        for prefix in (_MODEL, _VERSION)
        for route in (
            web.get(prefix, model_metadata),
            web.get(prefix + "/ready", model_ready),
            web.get(prefix + "/config", model_config),
            web.get(prefix + "/stats", model_statistics),
            web.get(prefix + "/selection", model_selection),
        )
    ),
    *shared_memory.ROUTES,
]

# Access levels, by handler (see rest/security.py): control needs the token from a non-exempt address
# and passes the browser checks; open needs nothing even when inference is protected.
CONTROL_HANDLERS = frozenset({
    load_model, unload_model, update_log_settings, change_trace_setting, *shared_memory.CONTROL_HANDLERS,
})
OPEN_HANDLERS = frozenset({server_live, server_ready, server_health, fleet_nonce})
UNLIMITED_HANDLERS = frozenset({server_live, server_ready, server_health, prometheus_metrics})
