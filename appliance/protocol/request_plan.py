"""What a front end keeps of a request it decoded in full, to decode the next ones a client sends the same
way without parsing and checking again what it said: each input's name, datatype and shape, the outputs
asked for, the request's ID and parameters, and the limits it was checked under. The HTTP lane's binary
requests (``appliance.rest.binary_header``) and gRPC's ModelInfer messages (``appliance.grpc.known_message``)
each keep one per connection and decide when a request is sent the same way; the plan makes the request."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferInput, InferRequest, RequestedOutput

__all__ = ["KnownBytes", "PlannedInput", "RequestPlan"]

P = TypeVar("P")


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    count: int
    """Its elements."""
    dtype: np.dtype | None
    """A fixed-size datatype's element; None for BYTES, whose items the front end reads
    (``decode_raw_tensor``)."""
    nbytes: int
    """A fixed-size tensor's bytes (0 for BYTES)."""

    @classmethod
    def of(cls, tensor: InferInput) -> PlannedInput:
        data = tensor.data
        fixed = tensor.datatype != "BYTES"
        return cls(tensor.name, tensor.datatype, data.shape, data.size, data.dtype if fixed else None,
                   data.nbytes if fixed else 0)

    def view(self, buffer: bytes | memoryview, offset: int = 0) -> np.ndarray:
        """A fixed-size input from ``nbytes`` bytes of ``buffer`` at ``offset`` (which holds them): a view."""
        return np.frombuffer(buffer, self.dtype, self.count, offset).reshape(self.shape)


@dataclasses.dataclass(frozen=True, slots=True)
class RequestPlan:
    limits: DecodeLimits
    """The limits the full decode checked the request against: a plan serves no other."""
    inputs: tuple[PlannedInput, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...]
    request_id: str | None
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferRequest, limits: DecodeLimits) -> RequestPlan | None:
        """The plan of a request decoded in full, or None for one a plan cannot make again (an input or
        output in shared memory)."""
        if request.shared_inputs or any(output.shared_memory is not None for output in request.outputs):
            return None
        return cls(limits, tuple(PlannedInput.of(tensor) for tensor in request.inputs),
                   tuple((output.name, dict(output.parameters)) for output in request.outputs), request.id,
                   dict(request.parameters))

    def request(self, inputs: list[InferInput]) -> InferRequest:
        """The request with ``inputs`` (made from this request's bytes); its dicts its own, as a later step
        may add to them."""
        outputs = [RequestedOutput(name, dict(parameters)) for name, parameters in self.outputs]
        return InferRequest(inputs, outputs, self.request_id, dict(self.parameters) if self.parameters else {})


_NO_PLAN = object()
"""Leading bytes seen twice whose requests no plan can make again."""


class KnownBytes(Generic[P]):
    """The leading bytes of the last request a connection sent that was decoded in full, and the plan made
    the second time in a row they came (``saw``); what a front end keeps per connection. Its state is one
    tuple, replaced whole: a decode on a worker thread may use it too."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[bytes, P | object | None] | None = None

    def plan(self, data: bytes, length: int | None = None) -> P | None:
        """The plan of the bytes ``data`` starts with (``length`` long, where given), if they have one."""
        last = self._last
        if last is None or (length is not None and length != len(last[0])) or not data.startswith(last[0]):
            return None
        plan = last[1]
        return None if plan is None or plan is _NO_PLAN else plan  # type: ignore[return-value]

    def saw(self, key: bytes, make: Callable[[], P | None]) -> None:
        """A request that starts with ``key`` was decoded in full: ``key`` remembered the first time, and
        ``make()`` (None: no plan can) the second time in a row."""
        last = self._last
        if last is not None and last[0] == key:
            if last[1] is None:
                made = make()
                self._last = (key, _NO_PLAN if made is None else made)
            return
        self._last = (key, None)

    def forget(self) -> None:
        """A request whose leading bytes no plan would take: nothing is remembered."""
        self._last = None
