"""Triton's three shared-memory parameters of an input or output, read from any front end's
parameter map (JSON object, or gRPC ``InferParameter`` values turned into Python values). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.core.errors import InvalidInput
from appliance.engine.types import SharedMemoryRef

__all__ = ["REGION", "BYTE_SIZE", "OFFSET", "shared_memory_ref"]

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
_MAX = (1 << 64) - 1  # an offset past the region is refused against the region, in Triton's words


def _count(value: Any, key: str, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX:
        raise InvalidInput(f"{what}: {key} must be a non-negative integer, got {str(value)[:40]!r}")
    return value


def shared_memory_ref(params: Mapping[str, Any], what: str) -> SharedMemoryRef | None:
    """The tensor's place in a region, or None when it is not in shared memory; ``what`` names the
    tensor in errors ("input 'INPUT0'")."""
    if REGION not in params:
        stray = [k for k in (BYTE_SIZE, OFFSET) if k in params]
        if stray:
            raise InvalidInput(f"{what}: {' and '.join(stray)} given without {REGION}")
        return None
    region = params[REGION]
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{what}: {REGION} must be the name of a registered region")
    if BYTE_SIZE not in params:
        raise InvalidInput(f"{what}: {REGION} needs {BYTE_SIZE} (the tensor's size in bytes)")
    return SharedMemoryRef(region, _count(params[BYTE_SIZE], BYTE_SIZE, what),
                           _count(params.get(OFFSET, 0), OFFSET, what))
