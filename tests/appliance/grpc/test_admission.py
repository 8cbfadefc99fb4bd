"""The receive slots of the gRPC admission: at most ``count`` messages received at once, handed over in
order, a wait bounded in time; the map of RPCs to operations covers the whole service."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import InvalidInput, RequestTimeout, Unavailable
from appliance.grpc.admission import OPERATIONS
from appliance.grpc.receive import DRAIN_BYTES as _DRAIN_BYTES
from appliance.grpc.receive import Receivers
from tests.waiting import await_until


def _messages(*items: bytes, never: bool = False):
    """A call's ``context.read``: each message, then grpc.aio.EOF; with ``never``, a read that never returns
    (until cancelled): a message that never comes."""
    left = list(items)

    async def read():
        if never:
            await asyncio.Event().wait()
        return left.pop(0) if left else grpc.aio.EOF

    return read


def test_every_rpc_of_the_service_names_its_operation():
    assert set(OPERATIONS) == set(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)


async def test_at_most_count_messages_are_received_at_once_and_waiters_go_in_order():
    receivers = Receivers(2, timeout=5)
    receiving, peak, order = 0, 0, []
    release = asyncio.Event()

    def slow(tag: int):
        async def read():
            nonlocal receiving, peak
            receiving += 1
            peak = max(peak, receiving)
            await release.wait()  # the first reads stay in progress while the other calls ask for a slot
            receiving -= 1
            order.append(tag)
            return b"x"
        return read

    received = asyncio.gather(*(receivers.receive(slow(i)) for i in range(6)))
    await await_until(lambda: receiving >= 2, timeout=10, what="two reads in progress")
    release.set()
    results = await received
    assert results == [b"x"] * 6 and peak == 2 and order[:2] == [0, 1]


async def test_a_message_that_never_comes_and_a_slot_that_never_frees_are_bounded():
    receivers = Receivers(1, timeout=0.2)
    first = asyncio.create_task(receivers.receive(_messages(b"late", never=True)))
    await await_until(lambda: receivers._free == 0, timeout=5, what="the first call to take the slot")
    second = asyncio.create_task(receivers.receive(_messages(b"late", never=True)))  # gets the slot at 0.2 s
    await await_until(lambda: len(receivers._waiting) == 1, timeout=5, what="the second call to queue")
    with pytest.raises(Unavailable, match="receiving 1 large messages"):  # still queued at its 0.2 s
        await receivers.receive(_messages(b"x"))
    for task in (first, second):
        with pytest.raises(RequestTimeout, match="did not arrive"):
            await task
    assert await receivers.receive(_messages(b"x")) == b"x"  # the slot came back
    with pytest.raises(InvalidInput, match="without its request message"):
        await receivers.receive(_messages())


async def test_a_large_message_is_read_to_the_end_of_its_call_and_a_second_one_refused():
    large = b"x" * _DRAIN_BYTES
    read = _messages(large)
    assert await Receivers(1, timeout=5).receive(read) == large
    assert await read() is grpc.aio.EOF  # the end was read too: grpc.aio lets go of the message
    with pytest.raises(InvalidInput, match="second request message"):
        await Receivers(1, timeout=5).receive(_messages(large, b"y"))
    small = _messages(b"y", b"z")
    assert await Receivers(1, timeout=5).receive(small) == b"y"
    assert await small() == b"z"  # a small one's end is not waited for
