"""Tensors and responses across the channel, on the model process's side: small tensors travel in the
message itself, larger ones in shared-memory blocks, only their descriptors in the message (``carry``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.errors import TritonError
from appliance.backends.python.model_process.pb.response import InferenceResponse
from appliance.backends.python.model_process.pb.tensor import Tensor
from appliance.backends.python.wire.arena import KEEP_BYTES, BlockRef, Descriptor, carry, taken
from appliance.backends.python.wire.messages import Response

__all__ = ["error_of", "read_tensors", "send_response", "tensors_of", "write_tensors"]


def tensors_of(tensors: list[Tensor], what: str) -> list[tuple[str, np.ndarray]]:
    """(name, array) of each tensor (BF16 as ``ml_dtypes.bfloat16``), as the arenas carry them."""
    return [(tensor.name(), tensor.raw()) for tensor in tensors]


def write_tensors(pairs: list[tuple[str, np.ndarray]]) -> tuple[BlockRef | None, list[Descriptor]]:
    """``pairs`` as a message carries them (``carry``): in it, or in a block of this process's."""
    return carry(runtime.current().blocks, pairs)


def read_tensors(ref: BlockRef | None, descriptors: list[Descriptor],
                 rt: runtime.Runtime | None = None) -> list[Tensor]:
    """The tensors of a daemon's message: carried in it, or in a block of the daemon's, copied out and
    given back at once. ``rt``: the runtime whose call this answers, when read on a thread where it is not
    current (the daemon's event loop reads an in-process model's answers)."""
    if not descriptors:
        return []
    current = rt or runtime.current()
    arrays = taken(current.attachments, ref, descriptors)
    if ref is not None:
        current.release(ref[0], now=ref[2] > KEEP_BYTES)
    return [Tensor(name, array) for name, array in arrays.items()]


def error_of(response: InferenceResponse) -> tuple[str, int] | None:
    error = response.error()
    return (error.message(), error.code()) if error is not None else None


def send_response(key: int, response: InferenceResponse | None, final: bool) -> None:
    """One response of a decoupled model's request (None: only the final flag)."""
    ref: BlockRef | None = None
    descriptors: list[Descriptor] = []
    error, parameters = None, None
    current = runtime.current()
    if response is not None:
        error = error_of(response)
        if error is None:
            ref, descriptors = carry(current.blocks, tensors_of(response.output_tensors(), "output"))
            if ref is not None:
                current.lent()
        parameters = response.parameters()
    current.send(Response(key, ref, descriptors, error, parameters, final))


def response_parameters(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}


def triton_error(error: tuple[str, int]) -> TritonError:
    return TritonError(error[0], error[1])
