"""ModelStreamInfer on its own (``serve_stream`` with a fake call): a large response serialised on a worker
thread keeps its place on the stream; the stream reads no further than ``max_pending`` ahead, and ends when
the server stops, when it idles, or when a response fails with ``triton_grpc_error``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import InferenceFailed
from appliance.engine.types import InferOutput, InferResponse
from appliance.grpc.codec import serialize_stream_response
from appliance.grpc.grpc_config import StreamRules
from appliance.grpc.stream import StreamAnswer, serve_stream
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES
from appliance.protocol.inflate import InflateLimits
from appliance.security.budget import Account, MemoryBudget


class _Call:
    """What serve_stream uses of a call: its metadata and peer, and ``write``, which records the bytes."""

    def __init__(self, metadata: tuple = ()) -> None:
        self.written: list[bytes] = []
        self.status: tuple[object, str] | None = None
        self._metadata = metadata

    def invocation_metadata(self) -> tuple:
        return self._metadata

    def set_trailing_metadata(self, trailing: object) -> None:
        pass

    async def abort(self, code: object, message: str) -> None:
        self.status = (code, message)
        raise _Aborted(message)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def write(self, message: bytes) -> None:
        self.written.append(message)


class _Aborted(Exception):
    """What the fake call's ``abort`` raises, as grpc's does."""


class _Gate:
    def __init__(self) -> None:
        self.stopping = asyncio.Event()

    def admit(self, operation: object, caller: object) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    async def wait_stopping(self) -> None:
        await self.stopping.wait()


class _Plane:
    def __init__(self) -> None:
        self._budget = MemoryBudget(1 << 30)

    def account(self) -> Account:
        return self._budget.account()


async def _requests(*ids: str) -> AsyncIterator[bytes]:
    for request_id in ids:
        yield pb.ModelInferRequest(model_name="m", id=request_id).SerializeToString()


async def _then_silence(read: list[str], *ids: str) -> AsyncIterator[bytes]:
    """``ids``, each noted in ``read`` as it is read, then nothing: the client keeps the stream open."""
    for request_id in ids:
        read.append(request_id)
        yield pb.ModelInferRequest(model_name="m", id=request_id).SerializeToString()
    await asyncio.Event().wait()
    yield b""  # never reached


def _written_ids(call: _Call) -> list[str]:
    return [pb.ModelStreamInferResponse.FromString(raw).infer_response.id for raw in call.written]


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


async def test_the_stream_reads_no_further_than_max_pending_ahead():
    """Two unanswered requests at most: the third is read once the first is answered."""
    release = {request_id: asyncio.Event() for request_id in "abc"}
    read: list[str] = []

    async def respond(message: pb.ModelInferRequest, account: Account):
        await release[message.id].wait()
        yield StreamAnswer(_response(message.id, 4), True)

    call = _Call()
    serving = asyncio.ensure_future(serve_stream(_then_silence(read, "a", "b", "c"), call, respond, _Gate(), _Plane(),
                                                 StreamRules(max_pending=2, idle_timeout=0.2), InflateLimits(1 << 30)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert read == ["a", "b"]
    release["a"].set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert read == ["a", "b", "c"] and _written_ids(call) == ["a"]
    release["b"].set()
    release["c"].set()
    with contextlib.suppress(_Aborted):
        await asyncio.wait_for(serving, 5)
    assert _written_ids(call) == ["a", "b", "c"]
    assert call.status is not None and "stream_idle_timeout" in call.status[1]  # then it idled


async def test_a_stopping_server_answers_what_was_read_then_ends_the_stream():
    release = asyncio.Event()
    read: list[str] = []

    async def respond(message: pb.ModelInferRequest, account: Account):
        await release.wait()
        yield StreamAnswer(_response(message.id, 4), True)

    call, gate = _Call(), _Gate()
    serving = asyncio.ensure_future(serve_stream(_then_silence(read, "a"), call, respond, gate, _Plane(), StreamRules(),
                                                 InflateLimits(1 << 30)))
    while read != ["a"]:
        await asyncio.sleep(0)
    gate.stopping.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not serving.done()  # "a" is still being answered
    release.set()
    try:
        await asyncio.wait_for(serving, 5)
    except _Aborted:
        pass
    assert _written_ids(call) == ["a"]
    assert call.status is not None and "server is stopping" in call.status[1]


async def test_a_stream_waiting_on_a_request_is_not_ended_for_idling():
    """The idle timeout counts only while nothing is in flight."""
    async def respond(message: pb.ModelInferRequest, account: Account):
        await asyncio.sleep(0.3)
        yield StreamAnswer(_response(message.id, 4), True)

    call = _Call()
    with contextlib.suppress(_Aborted):
        await asyncio.wait_for(serve_stream(_then_silence([], "slow"), call, respond, _Gate(), _Plane(),
                                            StreamRules(idle_timeout=0.1), InflateLimits(1 << 30)), 5)
    assert _written_ids(call) == ["slow"]
    assert call.status is not None and "stream_idle_timeout" in call.status[1]


async def test_a_failed_response_with_triton_grpc_error_ends_the_stream_at_once():
    hanging = asyncio.Event()

    async def respond(message: pb.ModelInferRequest, account: Account):
        if message.id == "fails":
            raise InferenceFailed("the model raised")  # from the model: with triton_grpc_error, the stream's status
        await hanging.wait()  # never answered: the failure does not wait for it
        yield StreamAnswer(_response(message.id, 4), True)

    call = _Call(metadata=(("triton_grpc_error", "true"),))
    with contextlib.suppress(_Aborted):
        await asyncio.wait_for(serve_stream(_then_silence([], "hangs", "fails"), call, respond, _Gate(), _Plane(),
                                            StreamRules(), InflateLimits(1 << 30)), 5)
    assert call.written == []
    assert call.status is not None and "the model raised" in call.status[1]


async def test_a_stream_cancelled_from_outside_cancels_its_requests():
    """The client went away: the call's task is cancelled, and so is every request it had in flight."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def respond(message: pb.ModelInferRequest, account: Account):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        yield StreamAnswer(_response(message.id, 4), True)

    serving = asyncio.ensure_future(serve_stream(_then_silence([], "a"), _Call(), respond, _Gate(), _Plane(),
                                                 StreamRules(), InflateLimits(1 << 30)))
    await started.wait()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    assert serving.cancelled()
    await asyncio.wait_for(cancelled.wait(), 5)
