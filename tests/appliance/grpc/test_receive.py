"""Receiving a call's message (``appliance.grpc.receive``): at most ``count`` messages received at once,
a freed slot goes to the connection holding fewest, one connection's pending receptions are capped, a wait
for a slot is bounded; the transport takes a slot only for a message its window cannot hold and meters
every byte."""

from __future__ import annotations

import asyncio
import gzip
import time

import grpc
import pytest

from appliance.core.errors import InvalidInput, RequestTimeout, Unavailable
from appliance.grpc.grpc_config import ReceiveRules
from appliance.grpc.http2.call import STREAM_WINDOW, Call
from appliance.grpc.http2.headers import Request
from appliance.grpc.receive import Receivers
from appliance.protocol.inflate import Compressed
from tests.appliance.grpc.memory_channel import MemoryChannel
from tests.waiting import await_until


class _Large:
    """A call whose message its window cannot hold (it takes a slot): ``message`` once ``arrived`` is set
    (at once without one), then EOF; ``reading`` counts the reads in progress."""

    reading = 0
    peak = 0

    def __init__(self, message: bytes = b"x", arrived: asyncio.Event | None = None) -> None:
        self.message = message
        self.arrived = arrived

    async def announced(self, rules: ReceiveRules) -> bool:
        return True

    def meter(self, rules: ReceiveRules) -> None:
        pass

    async def read(self):
        _Large.reading += 1
        _Large.peak = max(_Large.peak, _Large.reading)
        try:
            if self.arrived is not None:
                await self.arrived.wait()
            return self.message
        finally:
            _Large.reading -= 1


async def test_at_most_count_messages_are_received_at_once_and_waiters_go_in_order():
    receivers = Receivers(2, timeout=5)
    release, order = asyncio.Event(), []
    _Large.reading = _Large.peak = 0

    async def receive(tag: int) -> bytes:
        message = await receivers.receive(_Large(b"x", release), "client")
        order.append(tag)
        return message

    received = asyncio.gather(*(receive(i) for i in range(6)))
    await await_until(lambda: _Large.reading >= 2 and len(receivers._waiting) == 4, timeout=10,
                      what="two reads in progress, four calls waiting")
    release.set()
    assert await received == [b"x"] * 6 and _Large.peak == 2 and order[:2] == [0, 1]


async def test_a_slot_that_never_frees_is_waited_for_a_bounded_time_and_comes_back():
    receivers = Receivers(1, timeout=0.2)
    never, done = asyncio.Event(), asyncio.Event()
    held = asyncio.create_task(receivers.receive(_Large(b"late", done), "client"))
    await await_until(lambda: receivers._free == 0, timeout=5, what="the first call to take the slot")
    with pytest.raises(Unavailable, match="receiving 1 large messages"):
        await receivers.receive(_Large(b"x", never), "other")
    done.set()
    assert await held == b"late"
    assert await receivers.receive(_Large(b"x"), "other") == b"x"  # the slot came back
    with pytest.raises(InvalidInput, match="without its request message"):
        await receivers.receive(_Large(grpc.aio.EOF), "other")  # type: ignore[arg-type]


async def test_a_freed_slot_goes_to_the_connection_holding_fewest():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=60))
    order: list[str] = []
    first_done = asyncio.Event()

    async def receive(peer: str, arrived: asyncio.Event | None = None) -> None:
        await receivers.receive(_Large(b"x", arrived), peer)
        order.append(peer)

    first = asyncio.create_task(receive("busy", first_done))
    await await_until(lambda: receivers._free == 0, timeout=5, what="the first call to take the slot")
    queued = [asyncio.create_task(receive("busy")) for _ in range(3)]
    await await_until(lambda: len(receivers._waiting) == 3, timeout=5, what="three calls of busy to queue")
    other = asyncio.create_task(receive("other"))
    await await_until(lambda: len(receivers._waiting) == 4, timeout=5, what="other's call to queue")
    first_done.set()
    await asyncio.gather(first, *queued, other)
    assert order[:2] == ["busy", "other"]


async def test_one_connection_waits_for_a_bounded_number_of_slots():
    receivers = Receivers(1, rules=ReceiveRules(timeout=30, grace=60), per_connection=2)
    release = asyncio.Event()
    held = [asyncio.create_task(receivers.receive(_Large(b"x", release), "greedy")) for _ in range(2)]
    await await_until(lambda: receivers._peers["greedy"] == 2, timeout=5, what="greedy's two calls in")
    with pytest.raises(Unavailable, match="this connection has 2 messages"):
        await receivers.receive(_Large(), "greedy")
    other = asyncio.create_task(receivers.receive(_Large(b"other"), "other"))  # other connections are not refused
    release.set()
    assert await other == b"other"
    await asyncio.gather(*held)


def _call() -> Call:
    request = Request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/s/M"),
                       (b"content-type", b"application/grpc"), (b"grpc-encoding", b"gzip")])
    return Call(MemoryChannel(), 1, request, receive_window=STREAM_WINDOW, send_window=1 << 20)  # type: ignore[arg-type]


def _prefix(length: int, flag: int = 0) -> bytes:
    return bytes([flag]) + length.to_bytes(4, "big")


async def test_only_a_message_the_window_cannot_hold_takes_a_slot():
    rules = ReceiveRules(timeout=30, grace=1)
    small = _call()
    small.data(_prefix(3) + b"abc", 8, end=True)
    assert await small.announced(rules) is False and await small.read() == b"abc"
    large = _call()
    large.data(_prefix(STREAM_WINDOW * 4) + bytes(100), 105, end=False)
    assert await large.announced(rules) is True


async def test_a_compressed_message_is_handed_over_as_sent():
    call = _call()
    packed = gzip.compress(b"hello")
    call.data(_prefix(len(packed), flag=1) + packed, 5 + len(packed), end=True)
    message = await call.read()
    assert isinstance(message, Compressed) and message.coding == "gzip" and message == packed


async def test_a_stalled_message_is_cut_once_it_falls_behind_the_minimum_rate():
    rules = ReceiveRules(timeout=30, min_rate=64 * 1024, grace=0.2)
    receivers = Receivers(1, rules=rules)
    stalled = _call()
    stalled.data(_prefix(STREAM_WINDOW * 4) + bytes(100), 105, end=False)
    started = time.monotonic()
    with pytest.raises(RequestTimeout, match="grpc_receive_min_rate"):
        await receivers.receive(stalled, "attacker")
    assert time.monotonic() - started < 1.0
    silent = _call()  # not even a prefix: cut too, and without a slot
    with pytest.raises(RequestTimeout, match="grpc_receive_min_rate"):
        await receivers.receive(silent, "attacker")
    steady = _call()
    size = STREAM_WINDOW * 8
    steady.data(_prefix(size), 5, end=False)

    async def trickle() -> None:  # 1 MiB/s, well above the minimum rate
        for _ in range(size // 4096):
            await asyncio.sleep(0.004)
            steady.data(bytes(4096), 4096, end=False)

    sending = asyncio.create_task(trickle())
    assert len(await receivers.receive(steady, "client")) == size
    await sending
