"""ModelStreamInfer's writer on its own (``serve_stream`` with a fake call): a large response serialised on
a worker thread keeps its place on the stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from appliance.engine.types import InferOutput, InferResponse
from appliance.grpc.codec import serialize_stream_response
from appliance.grpc.grpc_config import StreamRules
from appliance.grpc.stream import StreamAnswer, serve_stream
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES
from appliance.protocol.inflate import InflateLimits
from appliance.security.budget import Account, MemoryBudget


class _Call:
    """What serve_stream uses of a call: its metadata and peer, and ``write``, which records the bytes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def write(self, message: bytes) -> None:
        self.written.append(message)


class _Gate:
    def admit(self, operation: object, caller: object) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    async def wait_stopping(self) -> None:
        await asyncio.Event().wait()


class _Plane:
    def __init__(self) -> None:
        self._budget = MemoryBudget(1 << 30)

    def account(self) -> Account:
        return self._budget.account()


async def _requests(*ids: str) -> AsyncIterator[bytes]:
    for request_id in ids:
        yield pb.ModelInferRequest(model_name="m", id=request_id).SerializeToString()


def _response(request_id: str, elements: int) -> InferResponse:
    return InferResponse("m", 1, [InferOutput("y", "FP32", np.arange(elements, dtype=np.float32))], id=request_id)


async def test_a_large_response_is_not_overtaken_by_a_small_one_ready_after_it():
    """The large answer of the first request is ready first and serialised on a worker thread; the small
    one of the second request, ready meanwhile, is written after it, as both were ready."""
    large = _response("large", DECODE_OFF_LOOP_BYTES)  # 4 MiB: serialised off the loop
    small = _response("small", 4)
    large_ready = asyncio.Event()

    async def respond(message: pb.ModelInferRequest, account: Account):
        if message.id == "large":
            large_ready.set()
            yield StreamAnswer(large, True)
        else:
            await large_ready.wait()
            yield StreamAnswer(small, True)

    call = _Call()
    await serve_stream(_requests("large", "small"), call, respond, _Gate(), _Plane(), StreamRules(),
                       InflateLimits(1 << 30))
    assert [pb.ModelStreamInferResponse.FromString(raw).infer_response.id for raw in call.written] == [
        "large", "small"]
    assert call.written == [serialize_stream_response(large, True), serialize_stream_response(small, True)]
