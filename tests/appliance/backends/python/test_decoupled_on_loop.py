"""A decoupled Python model whose channel the event loop reads, through the real scheduler and data plane:
a client behind in reading holds the model back (the loop stops reading the channel instead of
blocking), a client that stalls fails its own request, and the model serves on either way; an unload or
a stop meanwhile ends the stream at once; what waits in the channel is read in one wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios
import time
from collections.abc import Callable

import numpy as np
import pytest

from appliance.backends import named
from appliance.backends.base import RuntimeOptions
from appliance.backends.python.backend import PythonBackend
from appliance.backends.python.model_process.reading import COMMANDS
from appliance.backends.python.process import ModelProcess
from appliance.backends.python.wire.messages import Message
from appliance.core.errors import Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.streaming import StreamItem, StreamLimits
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferInput, InferRequest
from appliance.protocol.admission import Caller
from appliance.protocol.inference import Inference
from appliance.repository.config import signature_of
from appliance.repository.registry import ModelRegistry
from appliance.security.budget import MemoryBudget
from tests.appliance.backends.python.harness import loaded, parse_config
from tests.models import copy_model, read_config
from tests.waiting import await_until, wait_until

# COUNT responses, each its index, sent from execute() as fast as the channel takes them, then the final flag.
FLOOD = "backends/flood"
CONFIG = read_config(FLOOD)


class _Held:
    """The request's memory account: how many response bytes the stream holds now, and at most."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def reserve(self, size: int) -> None:
        self.now += size
        self.peak = max(self.peak, self.now)

    def release(self, size: int) -> None:
        self.now -= size


@pytest.fixture
async def flood(tmp_path):
    model_file = copy_model(tmp_path, FLOOD)
    with contextlib.ExitStack() as stack:
        backend: PythonBackend = stack.enter_context(loaded(model_file, CONFIG))
        config = parse_config(CONFIG)
        stats = ModelStats()
        scheduler = Scheduler("flood:1", InstancePool("flood:1", [backend]), policy_from_config(config), stats)
        model = ModelVersion("flood", 1, config, signature_of(config), named("python"), scheduler, stats)
        model.start()

        async def open_stream(count: int, limits: StreamLimits, held: _Held):
            inference = Inference(ModelRegistry(tmp_path, RuntimeOptions()), MemoryBudget(1 << 40), DecodeLimits(),
                                  shared_memory=None, tracer=None, stream_limits=limits)
            request = InferRequest([InferInput("COUNT", "INT32", np.array([count], np.int32))], id="r")
            return await inference.respond(model, request, Caller("127.0.0.1"), held.reserve, held.release)

        try:
            yield backend, open_stream, model
        finally:
            await model.close(10)


async def _read_all(stream) -> list[StreamItem]:
    try:
        async with asyncio.timeout(30):
            return [item async for item in stream]
    finally:
        stream.close()


async def _held_back(process: ModelProcess) -> None:
    """Until the loop holds back reading the model's channel (a response waits for room for the client)."""
    await await_until(lambda: process._resuming is not None, timeout=30, what="the loop holding back reading")


def _values(items: list[StreamItem]) -> list[int]:
    return [int(item.response.outputs[0].data[0]) for item in items if item.response is not None]


async def test_a_client_behind_holds_the_model_back_without_blocking_the_loop(flood):
    backend, open_stream, _ = flood
    held = _Held()
    stream = await open_stream(3000, StreamLimits(max_responses=8), held)
    first = await anext(stream)
    assert backend.reads_on_loop  # what this test is about: the loop, not a thread, reads the channel
    # The loop turns (it is never blocked: this wait runs on it) while the model waits for the client, holding
    # at most 8 responses of one INT32 for the client for all of 0.3 s.
    with pytest.raises(AssertionError, match="timed out"):
        await await_until(lambda: held.peak > 8 * 4, timeout=0.3, what="more than 8 responses held")
    rest = await _read_all(stream)
    assert _values([first, *rest]) == list(range(3000)) and rest[-1].final
    assert held.now == 0


async def test_a_client_that_stalls_fails_its_request_and_the_model_serves_on(flood):
    _, open_stream, _ = flood
    held = _Held()
    stalled = await open_stream(3000, StreamLimits(max_responses=4, stall_timeout=0.3), held)
    # Nothing read: after the 0.3 s stall the request fails, and what it held for the client is given back.
    await await_until(lambda: held.peak > 0 and held.now == 0, timeout=30, what="the stalled request failed")
    items = await _read_all(stalled)
    assert len(items) == 1 and items[0].final and isinstance(items[0].error, Unavailable)
    assert "read none of the 4 pending responses" in items[0].error.message
    # The rest of its responses are read and dropped; the next request is served in full.
    items = await _read_all(await open_stream(5, StreamLimits(), _Held()))
    assert _values(items) == [0, 1, 2, 3, 4] and items[-1].final


async def test_unloading_while_the_loop_holds_the_model_back_ends_the_stream_and_the_process(flood):
    backend, open_stream, model = flood
    stream = await open_stream(3000, StreamLimits(max_responses=4, stall_timeout=60), _Held())
    await anext(stream)
    assert backend._instance is not None
    await _held_back(backend._instance.process)  # the model blocks on a full pipe
    process = backend._instance.process.pid
    await asyncio.wait_for(model.close(10), 30)  # not the 60 s stall: the unload releases what waits for room
    items = await _read_all(stream)
    assert items[-1].final and items[-1].error is not None and "unloaded" in items[-1].error.message
    with pytest.raises(ProcessLookupError):
        os.kill(process, 0)


async def test_a_process_stopped_while_the_loop_holds_back_reading_ends_its_streams_at_once(flood):
    backend, open_stream, _ = flood
    stream = await open_stream(3000, StreamLimits(max_responses=4, stall_timeout=60), _Held())
    await anext(stream)
    assert backend._instance is not None
    await _held_back(backend._instance.process)  # the loop will not read the channel's end
    process = backend._instance.process
    # Off the loop, as a restart or an unload stops it: killed after 0.5 s, and the stopping thread
    # ends the channel itself rather than waiting 5 s for the loop to read its end.
    await asyncio.wait_for(asyncio.to_thread(process.stop, 0.5), 3)
    items = await _read_all(stream)
    assert items[-1].final and items[-1].error is not None and "exited with code" in items[-1].error.message


def _hold_until_sent(fd: int, quiet: float = 0.3, timeout: float = 30) -> None:
    """Block (the event loop with it) until the pipe ``fd`` reads from holds bytes and none have arrived
    for ``quiet`` seconds: the model has sent its responses and its reply, however slow the box."""
    last, since = -1, time.monotonic()

    def sent_and_quiet() -> bool:
        nonlocal last, since
        waiting = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        if waiting != last:
            last, since = waiting, time.monotonic()
            return False
        return bool(waiting) and time.monotonic() - since >= quiet

    wait_until(sent_and_quiet, timeout=timeout, what="the model's bytes, unread and no more coming")


async def test_the_messages_waiting_in_the_channel_are_read_in_one_turn_of_the_loop(flood, monkeypatch):
    backend, open_stream, _ = flood
    turns: list[tuple[int, int]] = []  # per wake-up: the bytes waiting in the channel before and after it
    readable, command = ModelProcess._readable, ModelProcess._command
    hold = False

    def waiting(self: ModelProcess) -> int:
        return struct.unpack("i", fcntl.ioctl(self.conn.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]

    def counted(self: ModelProcess) -> None:
        before = waiting(self)
        readable(self)
        turns.append((before, waiting(self)))

    def sending(self: ModelProcess, message: Message, on_reply: Callable[[Message | None], None]) -> bool:
        sent = command(self, message, on_reply)
        if hold and isinstance(message, COMMANDS):  # the request is on its way: the loop stays busy until the
            _hold_until_sent(self.conn.fileno())  # model has sent its 10 responses and its reply
        return sent

    monkeypatch.setattr(ModelProcess, "_readable", counted)  # before the loop starts reading the channel
    monkeypatch.setattr(ModelProcess, "_command", sending)
    assert _values(await _read_all(await open_stream(1, StreamLimits(), _Held()))) == [0]
    assert backend.reads_on_loop
    turns.clear()
    hold = True
    items = await _read_all(await open_stream(10, StreamLimits(), _Held()))
    assert _values(items) == list(range(10))
    # Each wake-up reads everything waiting (one message a turn would leave the rest behind); the loop was
    # held until the model had sent all 11 messages, so one wake-up reads them all, unless a loaded box
    # paused the model mid-send for longer than the hold's quiet time.
    assert turns and all(left == 0 for _, left in turns), turns
    assert len(turns) <= 2, turns
