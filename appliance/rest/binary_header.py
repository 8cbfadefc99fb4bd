"""A binary request's JSON header, decoded once for a connection that sends it again.

A client of Triton's binary tensor extension (tritonclient with ``binary_data``, perf_analyzer) sends the
same JSON header with every request whose tensors keep their names, types and shapes: only the tensor
bytes after it change. ``KnownHeader`` (one per lane connection's head) remembers the last header's bytes;
when the same bytes come a second time it decodes that request as a fresh one would and keeps what the
header said (each input's name, datatype, shape and byte count; the outputs asked for; the request's ID
and parameters) as a ``_Plan``. From the third time on, a request whose header is byte for byte the
plan's and whose body has exactly the bytes the plan's sizes add up to is decoded from the plan, without
parsing or checking the header again: a fixed-size input is a view of its bytes (which the header's size
says, and the full decode found right for its shape), a BYTES one is read by ``decode_raw_tensor`` and
counted on the request's account, as the full decode does.

What a plan holds depends on the header's bytes alone, and the full decode checked those bytes, so a
planned request is decoded as the full decode would decode it; anything else (other bytes, another body
length, other limits) is decoded in full. Only headers of at most ``MAX_KNOWN_HEADER`` bytes are
remembered, and only those whose inputs all come as binary data (not in JSON, not in shared memory) and
whose outputs name no shared memory region get a plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import orjson

from appliance.core.errors import InputMismatch
from appliance.engine.tensor_checks import DecodeLimits, decode_raw_tensor
from appliance.engine.types import InferInput, InferRequest
from appliance.protocol.request_plan import KnownBytes, RequestPlan
from appliance.rest.codec import decode_infer_request, input_allocation

__all__ = ["MAX_KNOWN_HEADER", "KnownHeader"]

MAX_KNOWN_HEADER = 4096
"""The longest JSON header a connection's ``KnownHeader`` remembers (kept beyond its request, uncounted)."""

@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    request: RequestPlan
    sizes: tuple[int, ...]
    """Each input's binary_data_size (the full decode found a fixed-size one what its shape needs)."""
    length: int
    """The body's length: the header's, then every input's bytes."""

    def decode(self, body: bytes, header_length: int, reserve: Callable[[int], None]) -> InferRequest:
        offset = header_length
        inputs = []
        for spec, size in zip(self.request.inputs, self.sizes, strict=True):
            if spec.dtype is not None:  # a view of its bytes, which are exactly its size (nothing to count)
                data = spec.view(body, offset)
            else:
                reserve(input_allocation(None, spec.count, True, len(body) - offset))
                try:
                    data = decode_raw_tensor(memoryview(body)[offset:offset + size], spec.datatype, spec.shape,
                                             spec.count, spec.name, "binary_data_size")
                except InputMismatch as mismatch:  # (BYTES items that do not fill their bytes)
                    mismatch.request_id = self.request.request_id
                    raise
            inputs.append(InferInput(spec.name, spec.datatype, data))
            offset += size
        return self.request.request(inputs)


def _plan(header: bytes, request: InferRequest, length: int, limits: DecodeLimits) -> _Plan | None:
    """The plan for requests with ``header`` (decoded in full into ``request``, a body of ``length`` bytes),
    or None where one cannot take them."""
    plan = RequestPlan.of(request, limits)
    if plan is None:
        return None
    sizes = []
    for raw in orjson.loads(header)["inputs"]:  # (read before: it parses, as a JSON object with an 'inputs' list)
        size = (raw.get("parameters") or {}).get("binary_data_size")
        if type(size) is not int:  # its data came in the JSON
            return None
        sizes.append(size)
    return _Plan(plan, tuple(sizes), length)


class KnownHeader:
    """The last JSON header of a connection's binary requests, and its plan once it came twice (module
    docstring)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: KnownBytes[_Plan] = KnownBytes()

    def decode(self, body: bytes, header_length: int, limits: DecodeLimits,
               reserve: Callable[[int], None]) -> InferRequest:
        """``decode_infer_request(body, header_length, limits, reserve)``, from the plan where it applies."""
        plan = self._seen.plan(body, header_length)
        if plan is not None and plan.request.limits is limits and len(body) == plan.length:
            return plan.decode(body, header_length, reserve)
        request = decode_infer_request(body, header_length, limits, reserve)
        if 0 < header_length <= MAX_KNOWN_HEADER:
            header = body[:header_length]
            self._seen.saw(header, lambda: _plan(header, request, len(body), limits))
        else:
            self._seen.forget()
        return request
