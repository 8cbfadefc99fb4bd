"""Every operation the protocol offers, and the one table of who may call it.

Both front ends name the operation a request asks for (REST by the route that matched, gRPC by the
RPC) and admit it through ``appliance.protocol.admission`` with this table: a route and the RPC that do
the same thing can never be guarded differently.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping

__all__ = ["ACCESS", "BOUNDLESS", "Access", "Operation"]


class Access(enum.Enum):
    __hash__ = object.__hash__  # (see Operation)

    OPEN = "open"
    """Health: needs nothing, even with protect_inference."""
    INFERENCE = "inference"
    """Inference, metadata and everything that reads: the token only with protect_inference."""
    CONTROL = "control"
    """Changes the server: the token unless the client is in auth_exempt_networks; over HTTP also the
    browser rules (no other site's page may send it)."""


class Operation(enum.Enum):
    # Members are singletons that compare by identity: hashed in C, not by Enum's Python ``__hash__``
    # (every request looks its operation up in ACCESS and BOUNDLESS).
    __hash__ = object.__hash__

    SERVER_LIVE = "server_live"
    SERVER_READY = "server_ready"
    SERVER_HEALTH = "server_health"
    SERVER_METADATA = "server_metadata"
    MODEL_READY = "model_ready"
    MODEL_METADATA = "model_metadata"
    MODEL_CONFIG = "model_config"
    MODEL_STATISTICS = "model_statistics"
    MODEL_SELECTION = "model_selection"
    INFER = "infer"
    INFER_STREAM = "infer_stream"
    REPOSITORY_INDEX = "repository_index"
    MODEL_LOAD = "model_load"
    MODEL_UNLOAD = "model_unload"
    SHM_STATUS = "shm_status"
    SHM_REGISTER = "shm_register"
    SHM_UNREGISTER = "shm_unregister"
    TRACE_SETTINGS = "trace_settings"
    TRACE_UPDATE = "trace_update"
    LOG_SETTINGS = "log_settings"
    LOG_UPDATE = "log_update"
    METRICS = "metrics"
    """Prometheus /metrics."""
    HISTORY = "history"
    """The on-device metrics history (SQLite)."""
    HARDWARE = "hardware"
    MODEL_MEMORY = "model_memory"
    """Load on demand, idle unload, the model memory budget: what each model holds and why (GET /v2/memory)."""
    FLEET = "fleet"
    FLEET_NONCE = "fleet_nonce"
    """This box's id and a nonce for one signed request (appliance.security.fleet_signature)."""
    DOCUMENTS = "documents"
    """The dashboard's page and files, the OpenAPI document."""


_CONTROL = {Operation.MODEL_LOAD, Operation.MODEL_UNLOAD, Operation.SHM_REGISTER, Operation.SHM_UNREGISTER,
            Operation.TRACE_UPDATE, Operation.LOG_UPDATE}
_OPEN = {Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.SERVER_HEALTH, Operation.FLEET_NONCE}

ACCESS: Mapping[Operation, Access] = types.MappingProxyType({
    operation: Access.CONTROL if operation in _CONTROL else Access.OPEN if operation in _OPEN else Access.INFERENCE
    for operation in Operation
})
"""The access level of every operation, for every transport."""

BOUNDLESS = frozenset({Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.SERVER_HEALTH, Operation.METRICS})
"""Operations outside max_concurrent_requests: a box busy with (or flooded by) requests still answers
its health checks and scrapes."""
