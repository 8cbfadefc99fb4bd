"""The daemon's OpenAPI 3 description (GET /v2/openapi.json). A test checks that every aiohttp route
appears here, so the description stays true."""

from __future__ import annotations

from typing import Any

from appliance import __version__

__all__ = ["openapi_document"]

_ERROR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_JSON = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
_EMPTY = {"description": "OK"}
_PROBLEM = {"type": "object", "required": ["kind", "message", "fix"],
            "properties": {"kind": {"type": "string"}, "message": {"type": "string"}, "fix": {"type": "string"}}}
_HEALTH = {"description": "OK", "content": {"application/json": {"schema": {
    "type": "object", "required": ["live", "ready", "state"],
    "properties": {
        "live": {"type": "boolean"},
        "ready": {"type": "boolean"},
        "state": {"type": "object", "required": ["path", "writable", "problems"],
                  "properties": {"path": {"type": "string"}, "writable": {"type": "boolean"},
                                 "reason": {"type": "string", "nullable": True},
                                 "problems": {"type": "array", "items": _PROBLEM}}},
    },
}}}}
_MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 255}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}


def _operation(summary: str, ok: dict, body: dict | None = None, parameters: list | None = None,
               errors: tuple[int, ...] = (400, 404, 503)) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **{str(c): _ERROR for c in errors}}}
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {"required": False, "content": {"application/json": {"schema": body}}}
    return operation


_TENSOR_IN = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                                "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]},
        "parameters": {"type": "object"},
        "data": {"type": "array"},
    },
}
_INFER_BODY = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": _TENSOR_IN},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"],
                                               "properties": {"name": {"type": "string"},
                                                              "parameters": {"type": "object"}}}},
    },
}


_GENERATE_BODY = {
    "type": "object",
    "description": "Keys naming a model input are that input (a value or a flat list, shaped to the input); "
                   "other keys are request parameters; 'id' is the request id.",
    "properties": {"id": {"type": "string"}, "parameters": {"type": "object"}},
    "additionalProperties": True,
}
_EVENTS = {"description": "OK", "content": {"text/event-stream": {"schema": {"type": "string"}}}}


def _model_paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for prefix, parameters in (("/v2/models/{model}", [_MODEL]), ("/v2/models/{model}/versions/{version}",
                                                                    [_MODEL, _VERSION])):
        paths[prefix] = {"get": _operation("Model metadata", _JSON, parameters=parameters)}
        paths[prefix + "/ready"] = {"get": _operation("Model readiness", _EMPTY, parameters=parameters)}
        paths[prefix + "/config"] = {"get": _operation("Model configuration (Triton's ModelConfig as JSON)", _JSON,
                                                       parameters=parameters)}
        paths[prefix + "/infer"] = {"post": _operation(
            "Inference (JSON, or Triton's binary tensor extension with Inference-Header-Content-Length)",
            _JSON, body=_INFER_BODY, parameters=parameters, errors=(400, 401, 404, 408, 413, 415, 500, 503))}
        paths[prefix + "/generate"] = {"post": _operation(
            "Triton's generate extension: inputs and parameters as top-level keys, exactly one response as flat "
            "JSON", _JSON, body=_GENERATE_BODY, parameters=parameters,
            errors=(400, 401, 404, 408, 413, 415, 500, 503))}
        paths[prefix + "/generate_stream"] = {"post": _operation(
            "Triton's generate extension, streaming: every response (of a decoupled model, as it is sent) as a "
            'server-sent event `data: {...}`; errors after the first event as `data: {"error": "..."}`',
            _EVENTS, body=_GENERATE_BODY, parameters=parameters, errors=(400, 401, 404, 408, 413, 415, 500, 503))}
        paths[prefix + "/stats"] = {"get": _operation("Statistics (Triton's statistics extension)", _JSON,
                                                      parameters=parameters)}
        paths[prefix + "/selection"] = {"get": _operation("Measured plan selection for the model", _JSON,
                                                          parameters=parameters)}
    return paths


_REGION = {"name": "region", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 255}}
_SYSTEM_REGISTER = {
    "type": "object", "required": ["key", "byte_size"],
    "properties": {"key": {"type": "string", "description": "POSIX shared memory object, e.g. /input0"},
                   "offset": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 1}},
}
_CUDA_REGISTER = {
    "type": "object", "required": ["raw_handle", "byte_size"],
    "properties": {"raw_handle": {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string"}}},
                   "device_id": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 1}},
}
_REGIONS = {"description": "OK", "content": {"application/json": {"schema": {"type": "array", "items": {
    "type": "object", "required": ["name", "byte_size"], "properties": {
        "name": {"type": "string"}, "key": {"type": "string"}, "offset": {"type": "integer"},
        "device_id": {"type": "integer"}, "byte_size": {"type": "integer"}}}}}}}


def _shared_memory_paths() -> dict[str, Any]:
    """Triton's shared-memory extensions (client_shm decides who may use them)."""
    paths: dict[str, Any] = {}
    for kind, title, body, register_errors in (
        ("system", "system", _SYSTEM_REGISTER, (400, 401, 403)),
        ("cuda", "CUDA", _CUDA_REGISTER, (400, 401, 403, 501)),
    ):
        base = f"/v2/{kind}sharedmemory"
        paths[f"{base}/status"] = {"get": _operation(f"Registered {title} shared memory regions", _REGIONS,
                                                     errors=(401, 403))}
        paths[base + "/region/{region}/status"] = {"get": _operation(
            f"One {title} shared memory region", _REGIONS, parameters=[_REGION], errors=(401, 403, 404))}
        paths[base + "/region/{region}/register"] = {"post": _operation(
            f"Register a {title} shared memory region", _EMPTY, body=body, parameters=[_REGION],
            errors=register_errors)}
        paths[f"{base}/unregister"] = {"post": _operation(f"Unregister every {title} shared memory region", _EMPTY,
                                                          errors=(401, 403))}
        paths[base + "/region/{region}/unregister"] = {"post": _operation(
            f"Unregister a {title} shared memory region", _EMPTY, parameters=[_REGION], errors=(401, 403))}
    return paths


_TRACE_VALUE = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}], "nullable": True}
_TRACE_BODY = {"type": "object", "properties": {
    key: _TRACE_VALUE for key in ("trace_level", "trace_rate", "trace_count", "log_frequency")}}


def _trace_paths() -> dict[str, Any]:
    """Triton's trace extension (traces are written under the state dir; trace_file is read-only)."""
    paths: dict[str, Any] = {}
    for path, scope, parameters in (("/v2/trace/setting", "Global", None),
                                    ("/v2/models/{model}/trace/setting", "A model's", [_MODEL])):
        paths[path] = {
            "get": _operation(f"{scope} trace settings", _JSON, parameters=parameters, errors=(404,)),
            "post": _operation(f"Change {scope.lower()} trace settings (null clears one); answers those in force",
                               _JSON, body=_TRACE_BODY, parameters=parameters, errors=(400, 401, 404, 501)),
        }
    return paths


def openapi_document() -> dict[str, Any]:
    history = [{"name": n, "in": "query", "required": False, "schema": {"type": t}}
               for n, t in (("model", "string"), ("version", "integer"), ("since", "integer"),
                            ("until", "integer"), ("step", "integer"))]
    control_body = {"type": "object", "properties": {"parameters": {"type": "object"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Edge inference appliance", "version": __version__,
                 "description": "KServe v2 REST with Triton's extensions, plus the appliance's own endpoints."},
        "paths": {
            "/": {"get": _operation("Dashboard (HTML)", {"description": "OK", "content": {"text/html": {}}},
                                    errors=())},
            "/dashboard/static/{filename}": {"get": _operation(
                "Dashboard assets", {"description": "OK"},
                parameters=[{"name": "filename", "in": "path", "required": True, "schema": {"type": "string"}}],
                errors=(404,))},
            "/metrics": {"get": _operation("Prometheus metrics (Triton's names)",
                                           {"description": "OK", "content": {"text/plain": {}}}, errors=(401, 503))},
            "/v2": {"get": _operation("Server metadata", _JSON, errors=())},
            "/v2/health": {"get": _operation(
                "Health details: live, ready, and the state dir (path, writable, problems with their fixes)",
                _HEALTH, errors=())},
            "/v2/health/live": {"get": _operation("Liveness", _EMPTY, errors=(503,))},
            "/v2/health/ready": {"get": _operation("Readiness", _EMPTY, errors=(503,))},
            "/v2/openapi.json": {"get": _operation("This description", _JSON, errors=())},
            "/v2/logging": {
                "get": _operation("The daemon's log settings (Triton's logging extension)", _JSON, errors=()),
                "post": _operation(
                    "Change the log settings at once; answers the settings now", _JSON,
                    body={"type": "object", "properties": {
                        "log_info": {"type": "boolean"}, "log_warning": {"type": "boolean"},
                        "log_error": {"type": "boolean"}, "log_verbose_level": {"type": "integer"},
                        "log_format": {"type": "string", "enum": ["default", "ISO8601"]}}},
                    errors=(400, 401, 403, 415, 501)),
            },
            "/v2/fleet": {"get": _operation(
                "The boxes this one sees on the LAN over mDNS (the dashboard's fleet panel): name, URL, "
                "dashboard link, hardware, ready models, version", _JSON, errors=(401,))},
            "/v2/fleet/nonce": {"get": _operation(
                "This box's id and a nonce for one signed request (Authorization: Fleet id=, nonce=, body=, mac=: "
                "an HMAC of the request under the token, which never travels; see docs/fleet.md). Needs no token",
                _JSON, errors=())},
            "/v2/probe": {"get": _operation("Hardware probe report", _JSON, errors=(503,))},
            "/v2/memory": {"get": _operation(
                "Load on demand, idle unload, the model memory budget (docs/memory.md): the rules in force, the "
                "budget and what is used of it, what each loaded model holds and why it is loaded, the loads and "
                "unloads by cause", _JSON, errors=(401,))},
            "/v2/history": {"get": _operation("Metrics history as time series", _JSON, parameters=history,
                                              errors=(400,))},
            "/v2/models/stats": {"get": _operation("Statistics of every model", _JSON, errors=())},
            "/v2/repository/index": {"post": _operation(
                "Repository index",
                {"description": "OK", "content": {"application/json": {"schema": {"type": "array"}}}},
                body={"type": "object", "properties": {"ready": {"type": "boolean"}}}, errors=(400,))},
            "/v2/repository/models/{model}/load": {"post": _operation(
                "Load or reload a model (explicit mode); with file overrides (parameters 'config' and "
                "'file:<version>/<name>': base64) a push, in every mode", _EMPTY, body=control_body,
                parameters=[_MODEL], errors=(400, 401, 404, 413, 501))},
            "/v2/repository/models/{model}/unload": {"post": _operation(
                "Unload a model (explicit mode; a pushed model in every mode, its files removed)", _EMPTY,
                body=control_body, parameters=[_MODEL],
                errors=(400, 401, 404))},
            **_model_paths(),
            **_shared_memory_paths(),
            **_trace_paths(),
        },
        "components": {"schemas": {"Error": {"type": "object", "required": ["error"],
                                             "properties": {"error": {"type": "string"}}}}},
    }
