"""Receiving a call's message (``appliance.grpc.receive``): grpc.aio's reads give their slot up past the
grace to a waiting call, a freed slot goes to the connection holding fewest, one connection's pending
receptions are capped; the appliance's transport takes a slot only for a message its window cannot hold
and meters every byte; grpc.aio's compressed messages are told by their first bytes."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import RequestTimeout, Unavailable
from appliance.grpc.grpc_config import ReceiveRules
from appliance.grpc.http2.call import STREAM_WINDOW, Call
from appliance.grpc.http2.headers import Request
from appliance.grpc.receive import Receivers, sniffed
from appliance.protocol.inflate import Compressed
from tests.waiting import await_until


def _reader(message: bytes = b"x", after: float = 0.0):
    """A grpc.aio ``context.read``: ``message`` after ``after`` seconds (forever when negative), then EOF."""
    sent = False

    async def read():
        nonlocal sent
        if sent:
            return grpc.aio.EOF
        await asyncio.sleep(3600 if after < 0 else after)
        sent = True
        return message

    return read


async def test_a_slot_held_past_the_grace_goes_to_a_waiting_call():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=0.2))
    stalled = asyncio.create_task(receivers.receive(_reader(after=-1), "attacker"))
    await await_until(lambda: receivers._free == 0, timeout=5, what="the stalled call to take the slot")
    started = time.monotonic()
    assert await receivers.receive(_reader(b"mine"), "client") == b"mine"
    assert 0.15 < time.monotonic() - started < 1.0
    with pytest.raises(Unavailable, match="grpc_receive_grace"):
        await stalled


async def test_a_slow_message_keeps_its_slot_while_no_call_waits():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=0.05))
    assert await receivers.receive(_reader(b"slow", after=0.3), "client") == b"slow"


async def test_a_freed_slot_goes_to_the_connection_holding_fewest():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=60))
    order: list[str] = []

    async def receive(peer: str, after: float) -> None:
        await receivers.receive(_reader(after=after), peer)
        order.append(peer)

    first = asyncio.create_task(receive("busy", 0.1))
    await await_until(lambda: receivers._free == 0, timeout=5, what="the first call to take the slot")
    queued = [asyncio.create_task(receive("busy", 0.01)) for _ in range(3)]
    await await_until(lambda: len(receivers._waiting) == 3, timeout=5, what="three calls of busy to queue")
    other = asyncio.create_task(receive("other", 0.01))
    await asyncio.gather(first, *queued, other)
    assert order[:2] == ["busy", "other"]


async def test_one_connection_waits_for_a_bounded_number_of_slots():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=60), per_connection=2)
    held = [asyncio.create_task(receivers.receive(_reader(after=0.2), "greedy")) for _ in range(2)]
    await await_until(lambda: receivers._peers["greedy"] == 2, timeout=5, what="greedy's two calls in")
    with pytest.raises(Unavailable, match="this connection has 2 messages"):
        await receivers.receive(_reader(), "greedy")
    assert await receivers.receive(_reader(b"other"), "other") == b"other"  # other connections are not refused
    await asyncio.gather(*held)


@pytest.mark.parametrize("message", [
    pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x1f\x8b" * 8]),
    pb.ModelMetadataRequest(name="m", version="1"),
    pb.RepositoryIndexRequest(ready=True),
    pb.SystemSharedMemoryRegisterRequest(name="r", key="/k", offset=25, byte_size=8),
    pb.ServerLiveRequest(),
])
def test_triton_requests_are_never_taken_for_compressed_ones(message):
    raw = message.SerializeToString()
    assert not isinstance(sniffed(raw), Compressed)
    assert sniffed(gzip.compress(raw)).coding == "gzip"  # type: ignore[attr-defined]
    assert sniffed(zlib.compress(raw)).coding == "deflate"  # type: ignore[attr-defined]


class _Channel:
    """What a Call needs of its connection, in memory."""

    max_message = 1 << 20
    send_window = 1 << 20
    max_frame = 1 << 14

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.peer = "ipv4:127.0.0.1:1"
        self.opened = 0

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def wait_window(self, call: Call) -> None:
        pass

    def open_stream_window(self, stream: int, increment: int) -> None:
        self.opened += increment

    def forget(self, call: Call) -> None:
        pass

    def hold(self, call: Call, size: int) -> bool:
        return True

    def release(self, size: int) -> None:
        pass


def _call(channel: _Channel) -> Call:
    request = Request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/s/M"),
                       (b"content-type", b"application/grpc"), (b"grpc-encoding", b"gzip")])
    return Call(channel, 1, request, receive_window=STREAM_WINDOW, send_window=1 << 20)  # type: ignore[arg-type]


def _prefix(length: int, flag: int = 0) -> bytes:
    return bytes([flag]) + length.to_bytes(4, "big")


async def test_only_a_message_the_window_cannot_hold_takes_a_slot():
    rules = ReceiveRules(timeout=30, grace=1)
    small = _call(_Channel())
    small.data(_prefix(3) + b"abc", 8, end=True)
    assert await small.announced(rules) is False and await small.read() == b"abc"
    large = _call(_Channel())
    large.data(_prefix(STREAM_WINDOW * 4) + bytes(100), 105, end=False)
    assert await large.announced(rules) is True


async def test_a_compressed_message_is_handed_over_as_sent():
    call = _call(_Channel())
    packed = gzip.compress(b"hello")
    call.data(_prefix(len(packed), flag=1) + packed, 5 + len(packed), end=True)
    message = await call.read()
    assert isinstance(message, Compressed) and message.coding == "gzip" and message == packed


async def test_a_stalled_message_is_cut_once_it_falls_behind_the_minimum_rate():
    rules = ReceiveRules(timeout=30, min_rate=64 * 1024, grace=0.2)
    receivers = Receivers(1, rules=rules)
    stalled = _call(_Channel())
    stalled.data(_prefix(STREAM_WINDOW * 4) + bytes(100), 105, end=False)
    started = time.monotonic()
    with pytest.raises(RequestTimeout, match="grpc_receive_min_rate"):
        await receivers.receive_metered(stalled, "attacker")
    assert time.monotonic() - started < 1.0
    silent = _call(_Channel())  # not even a prefix: cut too, and without a slot
    with pytest.raises(RequestTimeout, match="grpc_receive_min_rate"):
        await receivers.receive_metered(silent, "attacker")
    steady = _call(_Channel())
    size = STREAM_WINDOW * 8
    steady.data(_prefix(size), 5, end=False)

    async def trickle() -> None:  # 1 MiB/s, well above the minimum rate
        for _ in range(size // 4096):
            await asyncio.sleep(0.004)
            steady.data(bytes(4096), 4096, end=False)

    sending = asyncio.create_task(trickle())
    assert len(await receivers.receive_metered(steady, "client")) == size
    await sending
