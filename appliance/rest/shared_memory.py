"""Triton's shared-memory routes over REST: parse, call the data plane, answer.

    GET  /v2/{systemsharedmemory,cudasharedmemory}[/region/{region}]/status
    POST /v2/systemsharedmemory/region/{region}/register   {"key", "offset", "byte_size"}
    POST /v2/cudasharedmemory/region/{region}/register     {"raw_handle": {"b64"}, "device_id", "byte_size"}
    POST /v2/{systemsharedmemory,cudasharedmemory}[/region/{region}]/unregister
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from aiohttp import web

from appliance.core.errors import InvalidInput
from appliance.protocol.operations import Operation
from appliance.rest.jsonio import json_response, optional_json
from appliance.rest.keys import DATAPLANE
from appliance.rest.security import caller

__all__ = ["ROUTES"]

# A cudaIpcMemHandle_t is 64 bytes: 88 characters of base64.
_MAX_HANDLE_TEXT = 128


def _region(request: web.Request) -> str | None:
    return request.match_info.get("region")


async def system_status(request: web.Request) -> web.Response:
    regions = request.app[DATAPLANE].shared_memory_status("system", caller(request), _region(request))
    return json_response([region.as_json() for region in regions])


async def system_register(request: web.Request) -> web.Response:
    body = await optional_json(request, 'a JSON object such as {"key": "/input0", "offset": 0, "byte_size": 64}')
    name = request.match_info["region"]
    if "key" not in body:  # Triton's words, then the fix
        raise InvalidInput(f"Shared memory register request has no 'key' field; region '{name}' needs 'key' and "
                           "'byte_size'")
    if "byte_size" not in body:
        raise InvalidInput(f"Shared memory register request has no 'byte_size' field; region '{name}' needs 'key' "
                           "and 'byte_size'")
    request.app[DATAPLANE].register_system_shared_memory(caller(request), name, body["key"], body.get("offset", 0),
                                                         body["byte_size"])
    return web.Response(status=200)


async def system_unregister(request: web.Request) -> web.Response:
    await optional_json(request, "an empty body")
    await request.app[DATAPLANE].unregister_shared_memory("system", caller(request), _region(request))
    return web.Response(status=200)


async def cuda_status(request: web.Request) -> web.Response:
    regions = request.app[DATAPLANE].shared_memory_status("cuda", caller(request), _region(request))
    return json_response([region.as_json() for region in regions])


def _raw_handle(body: dict, name: str) -> bytes:
    handle = body.get("raw_handle")
    text = handle.get("b64") if isinstance(handle, dict) else None
    if not isinstance(text, str) or len(text) > _MAX_HANDLE_TEXT:
        raise InvalidInput(
            f"failed to register shared memory region '{name}': 'raw_handle' must be {{\"b64\": \"...\"}}, the "
            "base64 of the CUDA IPC handle (tritonclient.utils.cuda_shared_memory.get_raw_handle)"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"failed to register shared memory region '{name}': 'raw_handle.b64' is not base64"
        ) from None


async def cuda_register(request: web.Request) -> web.Response:
    body = await optional_json(request, 'a JSON object such as {"raw_handle": {"b64": "..."}, "device_id": 0, '
                                        '"byte_size": 64}')
    name = request.match_info["region"]
    plane = request.app[DATAPLANE]
    # Where CUDA cannot work, the data plane's answer (501) says what it needs, whatever the body holds.
    raw, byte_size = b"", 0
    if plane.cuda_shared_memory:
        raw, claimed = _raw_handle(body, name), body.get("byte_size")
        if type(claimed) is not int or claimed < 0:
            raise InvalidInput(f"failed to register shared memory region '{name}': 'byte_size' must be a "
                               "non-negative integer")
        byte_size = claimed
    await plane.register_cuda_shared_memory(caller(request), name, raw, body.get("device_id", 0), byte_size)
    return web.Response(status=200)


async def cuda_unregister(request: web.Request) -> web.Response:
    await optional_json(request, "an empty body")
    await request.app[DATAPLANE].unregister_shared_memory("cuda", caller(request), _region(request))
    return web.Response(status=200)


def _routes(kind: str, status: Callable, register: Callable,
            unregister: Callable) -> list[tuple[str, str, Callable, Operation]]:
    base = f"/v2/{kind}sharedmemory"
    return [
        ("GET", f"{base}/status", status, Operation.SHM_STATUS),
        ("GET", base + "/region/{region}/status", status, Operation.SHM_STATUS),
        ("POST", base + "/region/{region}/register", register, Operation.SHM_REGISTER),
        ("POST", f"{base}/unregister", unregister, Operation.SHM_UNREGISTER),
        ("POST", base + "/region/{region}/unregister", unregister, Operation.SHM_UNREGISTER),
    ]


ROUTES = [*_routes("system", system_status, system_register, system_unregister),
          *_routes("cuda", cuda_status, cuda_register, cuda_unregister)]
