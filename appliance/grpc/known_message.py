"""A ModelInferRequest whose bytes up to its tensors' a connection sent before, decoded once.

tritonclient and perf_analyzer write each ModelInferRequest with its ``raw_input_contents`` (field 7)
last, and everything before them (the model, the ID, the parameters, each input's name, datatype and
shape, the outputs asked for) the same for every request whose tensors keep their shapes. ``KnownMessage``
(one per connection's header block, beside its admission memo) remembers those leading bytes: the second
time a message starts with them, it is parsed and decoded in full and what it said becomes a ``_Plan``;
from then on a message that starts with the same bytes and goes on with exactly as many field-7 entries
as the plan has inputs, and nothing else, is decoded from the plan: its target known, each input counted
as the full decode counts it and made from its entry's bytes (a view, where they are exactly what its
shape needs; else ``decode_raw_tensor``, which reads BYTES items and refuses a wrong size), without
protobuf parsing the message or the decoder walking it.

Protobuf reads a message as the merge of its parts, so such a message is parsed as the known bytes (the
plan's, which hold no field-7 entry) plus those entries: what the full decode would make of it. Only
leading bytes of at most ``MAX_KNOWN_PREFIX`` are remembered, and only a message whose every input comes
in ``raw_input_contents`` (one entry each; none in ``contents``, none in shared memory) and whose outputs
name no shared memory region gets a plan; anything else is parsed and decoded in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import InputMismatch
from appliance.engine.tensor_checks import BYTES_ELEMENT_OVERHEAD, DecodeLimits, decode_raw_tensor
from appliance.engine.types import InferInput, InferRequest
from appliance.protocol.inference import Target
from appliance.protocol.request_plan import KnownBytes, RequestPlan

__all__ = ["MAX_KNOWN_PREFIX", "KnownMessage", "Planned"]

MAX_KNOWN_PREFIX = 1024
"""The longest leading bytes a ``KnownMessage`` remembers (kept beyond the request, uncounted). There is one
for each header block a connection keeps (at most 64, ``appliance.grpc.http2.headers``), so a connection
holds at most 64 KiB of them; tritonclient's and perf_analyzer's are a few hundred bytes."""

_RAW_TAG = 0x3A
"""Field 7 (``raw_input_contents``), length-delimited."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    request: RequestPlan
    target: Target
    empty_final: bool
    """Triton's reserved parameter, taken out of the plan's parameters."""
    size_names: tuple[str, ...]
    """Where each input's size comes from, for errors (``raw_input_contents[i] size``)."""
    prefix: int
    """The length of the leading bytes it was made for: its messages' entries start there."""

    def decode(self, chunks: list[memoryview], reserve: Callable[[int], None]) -> InferRequest:
        inputs = []
        try:
            for spec, chunk, size_name in zip(self.request.inputs, chunks, self.size_names, strict=True):
                reserve(len(chunk))
                if spec.dtype is not None and len(chunk) == spec.nbytes:
                    data = spec.view(chunk)
                else:  # BYTES, or an entry of another size (refused there)
                    if spec.dtype is None:
                        reserve(min(spec.count, len(chunk) // 4) * BYTES_ELEMENT_OVERHEAD)
                    data = decode_raw_tensor(chunk, spec.datatype, spec.shape, spec.count, spec.name, size_name)
                inputs.append(InferInput(spec.name, spec.datatype, data))
        except InputMismatch as mismatch:
            mismatch.request_id = self.request.request_id
            raise
        return self.request.request(inputs)


Planned = tuple[_Plan, list[memoryview]]
"""A message's plan, and its field-7 entries' bytes (views of the message)."""


def _entries(raw: bytes, start: int, count: int) -> list[memoryview] | None:
    """The ``count`` field-7 entries that make up ``raw`` from ``start`` to its end, or None where its bytes
    there are anything else."""
    end = len(raw)
    if count == 1 and end - start >= 3 and raw[start] == _RAW_TAG:  # one input (the common message): no loop
        first, second = raw[start + 1], raw[start + 2]
        if first < 0x80:  # a length below 128
            at, size = start + 2, first
        elif second < 0x80:  # below 16,384
            at, size = start + 3, (first & 0x7F) | second << 7
        else:
            return _each_entry(raw, start, count)
        return [memoryview(raw)[at:]] if at + size == end else None
    return _each_entry(raw, start, count)


def _each_entry(raw: bytes, start: int, count: int) -> list[memoryview] | None:
    """``_entries``, any number of them, each length a varint of up to five bytes."""
    view = memoryview(raw)
    chunks: list[memoryview] = []
    at, end = start, len(raw)
    while at < end:
        if raw[at] != _RAW_TAG or len(chunks) == count:
            return None
        at += 1
        size = shift = 0
        while True:  # the entry's length, a varint of at most 5 bytes (a message is far below 2^35 bytes)
            if at >= end or shift > 28:
                return None
            byte = raw[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if size > end - at:
            return None
        chunks.append(view[at:at + size])
        at += size
    return chunks if len(chunks) == count else None


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _plan(prefix: bytes, message: pb.ModelInferRequest, request: InferRequest, target: Target,
          limits: DecodeLimits, empty_final: bool) -> _Plan | None:
    """The plan for messages that start with ``prefix`` as ``message`` does (decoded in full into
    ``request``), or None where one cannot take them."""
    if (len(message.raw_input_contents) != len(message.inputs) or len(request.inputs) != len(message.inputs)
            or any(tensor.HasField("contents") for tensor in message.inputs) or not _split(prefix, message)):
        return None
    plan = RequestPlan.of(request, limits)
    if plan is None:
        return None
    return _Plan(plan, target, empty_final, tuple(f"raw_input_contents[{index}] size"
                                                  for index in range(len(request.inputs))), len(prefix))


class KnownMessage:
    """The leading bytes of a connection's last ModelInferRequest, and its plan once they came twice
    (module docstring)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: KnownBytes[_Plan] = KnownBytes()

    def match(self, raw: bytes) -> Planned | None:
        """``raw``'s plan and entries, where the plan takes it; None: parse and decode it in full (then
        ``learn``)."""
        plan = self._seen.plan(raw)
        if plan is None:
            return None
        chunks = _entries(raw, plan.prefix, len(plan.request.inputs))
        return None if chunks is None else (plan, chunks)

    def learn(self, raw: bytes, message: pb.ModelInferRequest, request: InferRequest, target: Target,
              limits: DecodeLimits, empty_final: bool) -> None:
        """A message parsed and decoded in full: its leading bytes remembered, and planned the second time
        they come."""
        contents = message.raw_input_contents
        tail = sum(1 + _varint_size(len(chunk)) + len(chunk) for chunk in contents)
        start = len(raw) - tail
        if not 0 < start <= MAX_KNOWN_PREFIX or _entries(raw, start, len(contents)) is None:
            self._seen.forget()  # (its entries are not last: no plan will take it)
            return
        prefix = raw[:start]
        self._seen.saw(prefix, lambda: _plan(prefix, message, request, target, limits, empty_final))


def _split(prefix: bytes, message: pb.ModelInferRequest) -> bool:
    """Whether ``prefix`` is whole fields without a field-7 entry, which with ``message``'s entries make
    ``message``: then any message of ``prefix`` and field-7 entries is parsed as the two parts merged."""
    try:
        head = pb.ModelInferRequest.FromString(prefix)
    except DecodeError:  # it ends inside a field
        return False
    if head.raw_input_contents:
        return False
    head.raw_input_contents.extend(message.raw_input_contents)
    return head == message
