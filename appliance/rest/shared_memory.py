"""Triton's shared-memory routes over REST: parse, call the core registry, answer.

    GET  /v2/{systemsharedmemory,cudasharedmemory}[/region/{region}]/status
    POST /v2/systemsharedmemory/region/{region}/register   {"key", "offset", "byte_size"}
    POST /v2/cudasharedmemory/region/{region}/register     {"raw_handle": {"b64"}, "device_id", "byte_size"}
    POST /v2/{systemsharedmemory,cudasharedmemory}[/region/{region}]/unregister

Whether the client is on this host is decided here (its address, the connection's own address, the
trusted proxies) with the core's ``LocalPeers``, and handed to the registry, which applies
``client_shm``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii

from aiohttp import web

from appliance.errors import InvalidInput, NotSupported
from appliance.protocol.shared_memory import SharedMemoryRegistry
from appliance.rest.jsonio import json_response, optional_json
from appliance.rest.keys import DATAPLANE
from appliance.rest.security import ACCESS, client_address

__all__ = ["CONTROL_HANDLERS", "ROUTES", "is_local_client"]

# A cudaIpcMemHandle_t is 64 bytes: 88 characters of base64.
_MAX_HANDLE_TEXT = 128


def is_local_client(request: web.Request) -> bool:
    """Whether the client of ``request`` is on this host (``LocalPeers``): the forwarded client behind a
    trusted proxy, else the peer, compared also with the address its connection reached."""
    shared_memory = request.app[DATAPLANE].shared_memory
    if shared_memory is None:
        return False
    client = client_address(request, request.app[ACCESS].trusted_proxies)
    connected_to = None
    if client == request.remote and request.transport is not None:
        sockname = request.transport.get_extra_info("sockname")
        connected_to = sockname[0] if isinstance(sockname, tuple) and sockname else None
    return shared_memory.local_peers.contains(client, connected_to)


def _registry(request: web.Request) -> SharedMemoryRegistry:
    shared_memory = request.app[DATAPLANE].shared_memory
    if shared_memory is None:
        raise NotSupported("shared memory is not served by this server")
    return shared_memory


def _region(request: web.Request) -> str | None:
    return request.match_info.get("region")


async def system_status(request: web.Request) -> web.Response:
    status = _registry(request).system.status(_region(request), local=is_local_client(request))
    return json_response(status)


async def system_register(request: web.Request) -> web.Response:
    body = await optional_json(request, 'a JSON object such as {"key": "/input0", "offset": 0, "byte_size": 64}')
    name = request.match_info["region"]
    if "key" not in body or "byte_size" not in body:
        raise InvalidInput(f"failed to register shared memory region '{name}': the body needs 'key' and 'byte_size'")
    _registry(request).system.register(name, body["key"], body.get("offset", 0), body["byte_size"],
                                       local=is_local_client(request))
    return web.Response(status=200)


async def system_unregister(request: web.Request) -> web.Response:
    await optional_json(request, "an empty body")
    _registry(request).system.unregister(_region(request), local=is_local_client(request))
    return web.Response(status=200)


async def cuda_status(request: web.Request) -> web.Response:
    return json_response(_registry(request).cuda.status(_region(request), local=is_local_client(request)))


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
    registry = _registry(request)
    local = is_local_client(request)
    # Where CUDA cannot work, the registry's answer (501) says what it needs, whatever the body holds.
    raw, byte_size = b"", 0
    if registry.cuda.enabled:
        raw, claimed = _raw_handle(body, name), body.get("byte_size")
        if type(claimed) is not int or claimed < 0:
            raise InvalidInput(f"failed to register shared memory region '{name}': 'byte_size' must be a "
                               "non-negative integer")
        byte_size = claimed
    # Off the loop: the first IPC handle a process opens initialises CUDA (a second or more).
    await asyncio.to_thread(registry.cuda.register, name, raw, body.get("device_id", 0), byte_size, local=local)
    return web.Response(status=200)


async def cuda_unregister(request: web.Request) -> web.Response:
    await optional_json(request, "an empty body")
    await asyncio.to_thread(_registry(request).cuda.unregister, _region(request), local=is_local_client(request))
    return web.Response(status=200)


def _routes(kind: str, status, register, unregister) -> list[web.RouteDef]:
    base = f"/v2/{kind}sharedmemory"
    return [
        web.get(f"{base}/status", status),
        web.get(base + "/region/{region}/status", status),
        web.post(base + "/region/{region}/register", register),
        web.post(f"{base}/unregister", unregister),
        web.post(base + "/region/{region}/unregister", unregister),
    ]


ROUTES = [*_routes("system", system_status, system_register, system_unregister),
          *_routes("cuda", cuda_status, cuda_register, cuda_unregister)]
# Registering and unregistering change the server's state: the token (off the exempt networks) and the
# browser checks apply, as to model loading.
CONTROL_HANDLERS = frozenset({system_register, system_unregister, cuda_register, cuda_unregister})
