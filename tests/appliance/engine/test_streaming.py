"""Decoupled models through the data plane's ``infer_stream``, with a backend double that sends through
the request's sink from its own threads, as Triton's Python backend does (the scheduler, channel and
statistics under test are the real ones)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import Backend, BackendRequest, BatchResult, RuntimeOptions, named
from appliance.core.errors import DeadlineExceeded, InferenceFailed, InvalidInput, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.streaming import ResponseChannel, StreamItem, StreamLimits
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferInput, InferRequest
from appliance.protocol.admission import Caller
from appliance.protocol.inference import Inference
from appliance.protocol.trace_settings import TraceSettings
from appliance.protocol.trace_writer import TraceWriter
from appliance.protocol.tracing import Tracer
from appliance.repository.config import signature_of
from appliance.repository.registry import ModelRegistry
from appliance.security.budget import MemoryBudget
from tests.waiting import await_until

CONFIG = """
name: "repeat" backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

Script = Callable[[BackendRequest], None]


class SendingBackend(Backend):
    """Runs ``script(request)`` for each request on a thread of its own (so responses may continue after
    ``run_requests`` returns); a script may also raise inside ``run_requests`` when ``fail`` is set."""

    def __init__(self, script: Script, fail: BaseException | None = None) -> None:
        self.script = script
        self.fail = fail
        self.threads: list[threading.Thread] = []

    def inputs(self):
        return None

    def outputs(self):
        return None

    def run(self, inputs, outputs):  # pragma: no cover - run_requests is the entry point
        raise AssertionError("a decoupled backend is driven through run_requests")

    def run_requests(self, requests):
        results: list = []
        for request in requests:
            assert request.sink is not None, "a decoupled model's request carries a sink"
            if self.fail is not None:
                results.append(self.fail)
                continue
            thread = threading.Thread(target=self.script, args=(request,), daemon=True)
            thread.start()
            self.threads.append(thread)
            results.append({})
        return BatchResult(results)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)


def _out(value: int) -> dict[str, np.ndarray]:
    return {"OUT": np.array([value], np.int32)}


@pytest.fixture
async def make_model(tmp_path):
    made: list[ModelVersion] = []

    async def make(backend: Backend, limits: StreamLimits | None = None) -> tuple[ModelVersion, _Plane]:
        config = text_format.Parse(CONFIG, mc.ModelConfig())
        stats = ModelStats()
        scheduler = Scheduler("repeat:1", InstancePool("repeat:1", [backend]), policy_from_config(config), stats)
        model = ModelVersion("repeat", 1, config, signature_of(config), named("python"), scheduler, stats)
        model.start()
        made.append(model)
        return model, _Plane(_inference(tmp_path, limits=limits))

    yield make
    for model in made:
        await model.close(10)


def _ignore(size: int) -> None:
    pass


def _inference(tmp_path, limits: StreamLimits | None = None, tracer: Tracer | None = None) -> Inference:
    return Inference(ModelRegistry(tmp_path, RuntimeOptions()), MemoryBudget(1 << 40), DecodeLimits(),
                     shared_memory=None, tracer=tracer, stream_limits=limits or StreamLimits())


class _Plane:
    """The data plane's inference, on a model built here (held by the test): a decoded request's responses."""

    def __init__(self, inference: Inference) -> None:
        self._inference = inference

    async def infer_stream(self, model: ModelVersion, request: InferRequest, reserve=_ignore, release=_ignore):
        return await self._inference.respond(model, request, Caller("127.0.0.1"), reserve, release)


class _Writer(TraceWriter):
    """A trace writer that says when it was handed a trace."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.added = threading.Event()

    def add(self, *args, **kwargs) -> None:
        super().add(*args, **kwargs)
        self.added.set()


def _request(*values: int, request_id: str | None = "r1") -> InferRequest:
    return InferRequest([InferInput("IN", "INT32", np.array(values, np.int32))], id=request_id)


def _mebibytes(count: int, sent: list[int]) -> Callable[[BackendRequest], None]:
    """A model sending ``count`` responses of 1 MiB, then the final flag; ``sent`` lists those sent."""

    def send(request: BackendRequest) -> None:
        for value in range(count):
            request.sink.send({"OUT": np.full(1 << 18, value, np.int32)})
            sent.append(value)
        request.sink.send(final=True)

    return send


async def _eventually(condition: Callable[[], bool]) -> None:
    await await_until(condition, timeout=30)


async def _never(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """``condition`` stays false for ``seconds`` (real time: the window the code under test is given to
    misbehave), failing as soon as it turns true."""
    with pytest.raises(AssertionError, match="timed out"):
        await await_until(condition, timeout=seconds, what=what)


async def _read_all(stream) -> list[StreamItem]:
    items = []
    try:
        async with asyncio.timeout(30):
            async for item in stream:
                items.append(item)
    finally:
        stream.close()
    return items


async def test_many_responses_arrive_in_order_and_the_last_is_final(make_model):
    def repeat(request: BackendRequest) -> None:
        for value in request.inputs["IN"]:
            request.sink.send(_out(int(value)), parameters={"index": int(value)})
        request.sink.send(final=True)

    model, plane = await make_model(SendingBackend(repeat))
    stream = await plane.infer_stream(model, _request(*range(500)))
    items = await _read_all(stream)
    assert [int(i.response.outputs[0].data[0]) for i in items[:-1]] == list(range(500))
    assert all(i.response.id == "r1" and i.response.parameters["index"] == n for n, i in enumerate(items[:-1]))
    assert not any(i.final for i in items[:-1])
    assert items[-1] == StreamItem(None, None, True)  # the final flag alone: Triton's empty final response
    stats = model.stats.as_json()["inference_stats"]
    assert stats["success"]["count"] == 1 and stats["fail"]["count"] == 0
    await _eventually(lambda: model.stats.execution_count == 1)  # run_requests may return after the final send


async def test_zero_responses_then_final(make_model):
    model, plane = await make_model(SendingBackend(lambda request: request.sink.send(final=True)))
    items = await _read_all(await plane.infer_stream(model, _request(1)))
    assert items == [StreamItem(None, None, True)]


async def test_a_response_may_be_final_itself(make_model):
    model, plane = await make_model(SendingBackend(lambda request: request.sink.send(_out(7), final=True)))
    (item,) = await _read_all(await plane.infer_stream(model, _request(1)))
    assert item.final and item.response.outputs[0].name == "OUT" and item.response.outputs[0].data.tolist() == [7]


async def test_the_instance_is_free_once_run_requests_returns(make_model):
    """Responses may continue after execute returns (Triton): a second request runs on the only instance
    while the first one's stream is still open."""
    second_ran = threading.Event()

    def script(request: BackendRequest) -> None:
        if int(request.inputs["IN"][0]) == 1:
            second_ran.wait(30)
            request.sink.send(_out(1), final=True)
        else:
            second_ran.set()
            request.sink.send(_out(2), final=True)

    model, plane = await make_model(SendingBackend(script))
    first = await plane.infer_stream(model, _request(1))
    second = await plane.infer_stream(model, _request(2))
    assert [i.response.outputs[0].data.tolist() for i in await _read_all(second)] == [[2]]
    assert [i.response.outputs[0].data.tolist() for i in await _read_all(first)] == [[1]]


async def test_an_error_response_mid_stream_and_the_stream_goes_on(make_model):
    def script(request: BackendRequest) -> None:
        request.sink.send(_out(1))
        request.sink.send(error=InferenceFailed("frame 2 is corrupt"))
        request.sink.send(_out(3), final=True)

    model, plane = await make_model(SendingBackend(script))
    items = await _read_all(await plane.infer_stream(model, _request(1)))
    assert [(i.response is not None, i.error is not None, i.final) for i in items] == [
        (True, False, False), (False, True, False), (True, False, True)]
    assert items[1].error.message == "frame 2 is corrupt"


async def test_a_final_error_fails_the_request_once(make_model):
    model, plane = await make_model(SendingBackend(lambda r: r.sink.send(error=ValueError("bad"), final=True)))
    (item,) = await _read_all(await plane.infer_stream(model, _request(1)))
    assert item.final and isinstance(item.error, InferenceFailed) and "ValueError: bad" in item.error.message
    stats = model.stats.as_json()["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 0
    assert model.stats.failures == {"BACKEND": 1}


async def test_a_backend_exception_ends_the_stream_with_its_error(make_model):
    model, plane = await make_model(SendingBackend(lambda r: None, fail=InferenceFailed("the model crashed")))
    (item,) = await _read_all(await plane.infer_stream(model, _request(1)))
    assert item.final and item.error.message == "the model crashed"


async def test_invalid_requests_fail_before_the_stream_starts(make_model):
    model, plane = await make_model(SendingBackend(lambda r: r.sink.send(final=True)))
    bad = InferRequest([InferInput("IN", "FP32", np.zeros(2, np.float32))])
    with pytest.raises(InvalidInput, match="data-type"):
        await plane.infer_stream(model, bad)
    assert model.stats.as_json()["inference_stats"]["fail"]["count"] == 0  # never counted: it never ran


async def test_closing_the_stream_cancels_the_request_and_the_model_sees_it(make_model):
    seen_cancelled = threading.Event()

    def endless(request: BackendRequest) -> None:
        value = 0
        while not request.cancelled():
            request.sink.send(_out(value))
            value += 1
            if value > 100_000:
                return  # the test failed: never cancelled
        seen_cancelled.set()
        request.sink.send(final=True)  # dropped: nobody reads any more

    backend = SendingBackend(endless)
    model, plane = await make_model(backend)
    stream = await plane.infer_stream(model, _request(1))
    received = [await anext(stream) for _ in range(3)]
    stream.close()
    assert [i.response.outputs[0].data.tolist() for i in received] == [[0], [1], [2]]
    assert await asyncio.to_thread(seen_cancelled.wait, 30)
    backend.join()
    assert model.stats.failures == {"CANCELED": 1}


async def test_a_cancelled_task_cancels_its_request(make_model):
    """What a front end does when its client disconnects: the task reading the stream is cancelled."""
    seen_cancelled = threading.Event()

    def wait_for_cancel(request: BackendRequest) -> None:
        request.sink.send(_out(0))
        while not request.cancelled():
            threading.Event().wait(0.01)
        seen_cancelled.set()

    model, plane = await make_model(SendingBackend(wait_for_cancel))
    started = asyncio.Event()

    async def consume() -> None:
        stream = await plane.infer_stream(model, _request(1))
        try:
            async for _ in stream:
                started.set()
        finally:
            stream.close()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(seen_cancelled.wait, 30)


async def test_a_model_ahead_of_its_reader_is_held_back(make_model):
    """Backpressure: with nothing read, the model's sends block once max_responses are pending, and
    the memory held stays bounded however many it means to send."""
    sent = []

    def flood(request: BackendRequest) -> None:
        for value in range(1000):
            request.sink.send(_out(value))
            sent.append(value)
        request.sink.send(final=True)

    backend = SendingBackend(flood)
    model, plane = await make_model(backend, StreamLimits(max_responses=8))
    stream = await plane.infer_stream(model, _request(1))
    first = await anext(stream)
    # give the model every chance to run ahead: 8 pending plus the one read, never more
    await _never(lambda: len(sent) > 8 + 1, 0.5, "the model sending past the bound")
    rest = await _read_all(stream)
    assert [int(i.response.outputs[0].data[0]) for i in [first, *rest[:-1]]] == list(range(1000))
    assert rest[-1].final


async def test_a_byte_bound_holds_back_large_responses(make_model):
    sent: list[int] = []
    big = _mebibytes(20, sent)

    model, plane = await make_model(SendingBackend(big), StreamLimits(max_bytes=3 << 20))
    stream = await plane.infer_stream(model, _request(1))
    await anext(stream)
    await _never(lambda: len(sent) > 3 + 1, 0.5, "the model sending past the byte bound")
    assert len(await _read_all(stream)) == 20


async def test_a_reader_that_stalls_fails_the_request_and_frees_the_model(make_model):
    unblocked = threading.Event()

    def flood(request: BackendRequest) -> None:
        for value in range(100):
            request.sink.send(_out(value))
        unblocked.set()
        assert request.cancelled()

    model, plane = await make_model(SendingBackend(flood), StreamLimits(max_responses=4, stall_timeout=0.2))
    stream = await plane.infer_stream(model, _request(1))
    assert await asyncio.to_thread(unblocked.wait, 30)
    items = await _read_all(stream)
    assert len(items) == 1 and items[0].final and isinstance(items[0].error, Unavailable)
    assert "read none of the 4 pending responses" in items[0].error.message


async def test_unloading_ends_open_streams(make_model):
    release = threading.Event()

    def slow(request: BackendRequest) -> None:
        request.sink.send(_out(1))
        release.wait(30)

    model, plane = await make_model(SendingBackend(slow))
    stream = await plane.infer_stream(model, _request(1))
    assert (await anext(stream)).response is not None
    await model.close(10)
    release.set()
    items = await _read_all(stream)
    assert len(items) == 1 and isinstance(items[0].error, Unavailable) and "unloaded" in items[0].error.message


async def test_unread_responses_count_against_the_memory_budget_and_are_given_back(make_model):
    """Unread responses are held on the request's account: the daemon-wide budget bounds them across
    every stream, and nothing stays counted once the stream is read, or dropped."""
    sent: list[int] = []
    big = _mebibytes(12, sent)

    budget = MemoryBudget(4 << 20)
    model, plane = await make_model(SendingBackend(big))
    with budget.account() as account:
        stream = await plane.infer_stream(model, _request(1), reserve=account.reserve,
                                          release=account.release)
        await anext(stream)
        # the budget, not the stream's bound, holds it back
        await _never(lambda: len(sent) > 4 + 1 or budget.used > 4 << 20, 0.5, "the model sending past the budget")
        assert len(await _read_all(stream)) == 12
        assert account.held == 0
    release = threading.Event()

    def stuck(request: BackendRequest) -> None:
        request.sink.send({"OUT": np.zeros(1 << 18, np.int32)})
        request.sink.send({"OUT": np.zeros(1 << 18, np.int32)})
        release.wait(30)

    model, plane = await make_model(SendingBackend(stuck))
    with budget.account() as account:
        stream = await plane.infer_stream(model, _request(1), reserve=account.reserve,
                                          release=account.release)
        await _eventually(lambda: account.held == 2 << 20)
        stream.close()  # the client went away: what it never read is given back
        assert account.held == 0
    release.set()


async def test_a_response_the_budget_cannot_hold_fails_the_request(make_model):
    model, plane = await make_model(SendingBackend(lambda r: r.sink.send({"OUT": np.zeros(1 << 20, np.int32)})))
    budget = MemoryBudget(1 << 20)
    with budget.account() as account:
        stream = await plane.infer_stream(model, _request(1), reserve=account.reserve,
                                          release=account.release)
        (item,) = await _read_all(stream)
    assert item.final and "max_request_memory_bytes" in item.error.message and budget.used == 0


async def test_a_traced_stream_is_written_when_it_ends(make_model, tmp_path):
    settings, writer = TraceSettings(), _Writer(None)
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
    model, _ = await make_model(SendingBackend(lambda r: (r.sink.send(_out(1)), r.sink.send(final=True))))
    tracer = Tracer(settings, writer)
    plane = _Plane(_inference(tmp_path, tracer=tracer))
    request = _request(1)
    request.trace = tracer.start(model.name, model.version)  # as infer_stream starts it
    stream = await plane.infer_stream(model, request)
    assert len(await _read_all(stream)) == 2
    await stream.ran
    await asyncio.to_thread(writer.added.wait, 30)  # the trace is handed to the writer by the callback of ``ran``
    writer.close()
    (trace,) = writer.kept()
    names = [t["name"] for t in trace["timestamps"]]
    assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END" and "QUEUE_START" in names
    assert "COMPUTE_START" in names and trace["model_name"] == "repeat"


async def test_a_stream_closed_while_its_request_is_queued_never_runs(make_model):
    release, ran = threading.Event(), []

    class Blocking(SendingBackend):
        def run_requests(self, requests):
            ran.extend(int(r.inputs["IN"][0]) for r in requests)
            if ran[-1] == 1:
                release.wait(30)  # holds the only instance
            return super().run_requests(requests)

    model, plane = await make_model(Blocking(lambda r: r.sink.send(final=True)))
    first = await plane.infer_stream(model, _request(1))
    await _eventually(lambda: ran == [1])
    second = await plane.infer_stream(model, _request(2))
    second.close()  # its client went away while it waited for the instance
    release.set()
    assert len(await _read_all(first)) == 1
    assert len(await _read_all(await plane.infer_stream(model, _request(3)))) == 1
    assert ran == [1, 3] and model.stats.failures == {"CANCELED": 1}  # 2 would have run before 3


async def test_a_stream_past_its_deadline_is_cancelled_and_ends_deadline_exceeded(make_model):
    seen_cancelled = threading.Event()

    def never_final(request: BackendRequest) -> None:  # streams until cancelled, and never sends final
        while not request.cancelled():
            request.sink.send(_out(1))
            threading.Event().wait(0.02)
        seen_cancelled.set()
        request.sink.send(_out(2))  # dropped: the request has ended

    model, plane = await make_model(SendingBackend(never_final), StreamLimits(deadline=0.3))
    items = await _read_all(await plane.infer_stream(model, _request(1)))
    assert items and all(i.response.outputs[0].data.tolist() == [1] for i in items[:-1])
    last = items[-1]
    assert last.final and isinstance(last.error, DeadlineExceeded) and "request_deadline (0.3 s)" in last.error.message
    assert last.error.status == 504 and last.error.grpc_code == "DEADLINE_EXCEEDED"
    assert await asyncio.to_thread(seen_cancelled.wait, 30)
    assert model.stats.failures == {"CANCELED": 1}


async def test_a_stream_that_ends_in_time_is_not_touched_by_its_deadline(make_model):
    model, plane = await make_model(SendingBackend(lambda r: (r.sink.send(_out(3)), r.sink.send(final=True))),
                                    StreamLimits(deadline=0.2))
    items = await _read_all(await plane.infer_stream(model, _request(1)))
    assert [i.error for i in items] == [None, None] and items[-1].final
    assert model.stats.failures == {} and model.stats.success.count == 1
    # past the deadline: nothing happens to a request that has ended
    await _never(lambda: model.stats.failures or model.stats.success.count != 1, 0.4, "the ended request touched")


async def test_a_stream_queued_past_its_deadline_never_runs(make_model):
    release, ran = threading.Event(), []

    class Blocking(SendingBackend):
        def run_requests(self, requests):
            ran.extend(int(r.inputs["IN"][0]) for r in requests)
            if ran[-1] == 1:
                release.wait(30)  # holds the only instance past the second request's deadline
            return super().run_requests(requests)

    model, plane = await make_model(Blocking(lambda r: r.sink.send(final=True)), StreamLimits(deadline=0.3))
    first = await plane.infer_stream(model, _request(1))
    await _eventually(lambda: ran == [1])
    second = await _read_all(await plane.infer_stream(model, _request(2)))
    assert isinstance(second[-1].error, DeadlineExceeded)
    release.set()
    assert isinstance((await _read_all(first))[-1].error, DeadlineExceeded)  # it had run past it too
    assert len(await _read_all(await plane.infer_stream(model, _request(3)))) == 1
    assert ran == [1, 3]


# -- a producer on the event loop (an ensemble streaming its answers): ResponseChannel.put ----------------


async def test_put_waits_for_the_reader_without_blocking_the_loop():
    channel = ResponseChannel("ensemble", asyncio.get_running_loop(), StreamLimits(max_responses=2))
    assert await channel.put(_out(0)) and await channel.put(_out(1))
    third = asyncio.create_task(channel.put(_out(2), final=True))
    await await_until(lambda: channel._room is not None, what="put waiting for room")
    assert not third.done()  # full: it waits, and the loop runs on (this test does)
    first = await channel.receive()
    assert first is not None and int(first.outputs["OUT"][0]) == 0
    assert await asyncio.wait_for(third, 5)
    rest = [await channel.receive(), await channel.receive()]
    assert [int(r.outputs["OUT"][0]) for r in rest if r is not None] == [1, 2] and rest[-1].final
    assert await channel.receive() is None


async def test_put_fails_the_request_when_the_reader_stalls():
    channel = ResponseChannel("ensemble", asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_timeout=0.2))
    assert await channel.put(_out(0))
    assert not await asyncio.wait_for(channel.put(_out(1)), 5)  # stalled: the producer is told to stop
    end = await channel.receive()
    assert end is not None and end.final and end.error is not None and "read none of the" in end.error.message
    assert channel.cancelled()


async def test_put_stops_at_once_when_the_reader_goes_away():
    channel = ResponseChannel("ensemble", asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_timeout=30))
    assert await channel.put(_out(0))
    waiting = asyncio.create_task(channel.put(_out(1)))
    await await_until(lambda: channel._room is not None, what="put waiting for room")
    channel.cancel()
    assert not await asyncio.wait_for(waiting, 1)
    assert not await channel.put(_out(2))


# -- a producer on the event loop that cannot wait inline (a model process's channel): ResponseChannel.offer --


async def test_offer_queues_at_once_while_there_is_room_and_hands_back_the_wait_when_full():
    channel = ResponseChannel("python", asyncio.get_running_loop(), StreamLimits(max_responses=2))
    assert channel.offer(_out(0)) is None and channel.offer(_out(1)) is None  # queued at once
    waiting = channel.offer(_out(2), final=True)
    assert waiting is not None
    task = asyncio.ensure_future(waiting)
    await await_until(lambda: channel._room is not None, what="the offer's wait for room")
    assert not task.done()  # full: the third waits for the reader, the loop runs on
    first = await channel.receive()
    assert first is not None and int(first.outputs["OUT"][0]) == 0
    assert await asyncio.wait_for(task, 5)  # queued once there was room
    rest = [await channel.receive(), await channel.receive()]
    assert [int(r.outputs["OUT"][0]) for r in rest if r is not None] == [1, 2] and rest[-1].final
    assert channel.offer(_out(3)) is None  # after the final one: dropped
    assert await channel.receive() is None


async def test_offer_drops_after_cancellation_and_its_wait_fails_a_stalled_request():
    channel = ResponseChannel("python", asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_timeout=0.2))
    assert channel.offer(_out(0)) is None
    waiting = channel.offer(_out(1))
    assert waiting is not None and not await asyncio.wait_for(waiting, 5)  # stalled
    end = await channel.receive()
    assert end is not None and end.final and end.error is not None and "read none of the" in end.error.message
    assert channel.cancelled() and channel.offer(_out(2)) is None


async def test_failing_a_stream_releases_a_model_waiting_for_room_and_tells_it_cancelled():
    channel = ResponseChannel("python", asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_timeout=30))
    channel.send(_out(0))
    waiting = asyncio.ensure_future(asyncio.to_thread(channel.send, _out(1)))  # a model thread, no room
    await await_until(lambda: channel._lock._waiters, what="the model thread waiting for room")
    assert not waiting.done()
    channel.fail(Unavailable("model repeat version 1 was unloaded"))
    await asyncio.wait_for(waiting, 5)  # at once, not after the 30 s stall; its response is dropped
    assert channel.cancelled()
    first, end = await channel.receive(), await channel.receive()
    assert first is not None and int(first.outputs["OUT"][0]) == 0  # sent before: still delivered
    assert end is not None and end.final and "unloaded" in end.error.message
    assert await channel.receive() is None
