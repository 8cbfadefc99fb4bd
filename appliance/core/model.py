"""A loaded, servable model version: validation, scheduling and output post-processing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BackendInfo
from appliance.core.classification import classify
from appliance.core.config import input_reshapes
from appliance.core.scheduler import Scheduler
from appliance.core.signature import ModelSignature
from appliance.core.stats import FailureReason, ModelStats
from appliance.core.traffic import TrafficStats
from appliance.core.types import InferOutput, InferRequest, InferResponse, RequestedOutput
from appliance.core.validation import validate_request
from appliance.errors import ApplianceError, InferenceFailed, InvalidInput, Unavailable
from appliance.tensors import v2_datatype

__all__ = ["ModelVersion"]


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return FailureReason.CANCELED
    if isinstance(exc, Unavailable):
        return FailureReason.REJECTED
    if isinstance(exc, (InferenceFailed, ApplianceError)) and not isinstance(exc, InvalidInput):
        return FailureReason.BACKEND
    return FailureReason.OTHER


@dataclasses.dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: mc.ModelConfig
    signature: ModelSignature
    backend: BackendInfo
    scheduler: Scheduler
    stats: ModelStats
    labels: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    selection: dict[str, Any] | None = None
    """The measured plan decision (see appliance.selection), with ``cache`` hit/miss."""

    def __post_init__(self) -> None:
        self._users = 0  # requests holding this version (see in_use), so a retired version drains
        self.traffic = TrafficStats(self.signature.batched)
        """The shapes, batch sizes and concurrency of the requests this version served, when selection
        chose its plan (see core.retune)."""
        batch = (-1,) if self.signature.batched else ()
        # config `reshape`: clients send `dims`, the runtime sees `reshape.shape` (and back for outputs).
        self._input_reshape = input_reshapes(self.config)
        self._output_reshape = {
            o.name: (*batch, *o.dims) for o in self.config.output if o.HasField("reshape")
        }
        # No outputs named in a request: every output the model has, none classified (built once).
        self._every_output = [RequestedOutput(name) for name in self.signature.outputs]
        self._every_output_name = [name for name in self.signature.outputs]

    @property
    def platform(self) -> str:
        return self.config.platform or self.backend.platform

    def start(self) -> None:
        self.scheduler.start()

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and post-process one request; counts it in ``stats`` and ``traffic`` once
        it is valid."""
        batch_size = validate_request(self.name, self.signature, request)
        if self.selection is not None:  # what retuning on traffic looks at
            self.traffic.record(((t.name, t.data.shape) for t in request.inputs), batch_size, self._users)
        start = time.perf_counter_ns()
        try:
            response = await self._run(request, batch_size)
        except BaseException as exc:
            self.stats.record_request(False, time.perf_counter_ns() - start, _failure_reason(exc))
            raise
        self.stats.record_request(True, time.perf_counter_ns() - start)
        return response

    async def _run(self, request: InferRequest, batch_size: int) -> InferResponse:
        inputs = {t.name: t.data for t in request.inputs}
        for name, shape in self._input_reshape.items():
            if name in inputs:
                inputs[name] = inputs[name].reshape(shape)
        wanted = request.outputs or self._every_output
        names = [o.name for o in wanted] if request.outputs else self._every_output_name
        results = await self.scheduler.submit(inputs, names, batch_size, request.parameters, request.trace)
        outputs = []
        for requested in wanted:
            name = requested.name
            data = results.get(name)
            if data is None:
                raise InferenceFailed(f"model '{self.name}' version {self.version} did not produce output '{name}'")
            data = np.asarray(data) if not isinstance(data, np.ndarray) else data
            if name in self._output_reshape:
                data = data.reshape(self._output_reshape[name])
            if requested.classification:
                data = classify(name, data, requested.classification, self.labels.get(name, []),
                                self.signature.batched)
            outputs.append(InferOutput(name, v2_datatype(data.dtype), data))
        return InferResponse(self.name, self.version, outputs, id=request.id)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[ModelVersion]:
        """Held by a request from lookup to response: a version being replaced or unloaded waits for
        every request that already chose it, even one still reading its body."""
        self._users += 1
        try:
            yield self
        finally:
            self._users -= 1

    async def drain(self, timeout: float) -> bool:
        """Wait (bounded) until no request holds this version and its queue and instances are idle."""
        deadline = time.monotonic() + timeout
        while self._users and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await self.scheduler.drain(max(0.0, deadline - time.monotonic()))

    async def close(self, timeout: float | None = None) -> list[BaseException]:
        return await self.scheduler.close(timeout)
