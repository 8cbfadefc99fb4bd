"""Requests bound to regions: inputs read (checked before anything is allocated), outputs written
(Triton's error when a region is too small), leases across an unregister, and shrunk objects."""

from __future__ import annotations

import asyncio
import os
import threading

import ml_dtypes
import numpy as np
import pytest

from appliance.core.errors import AlreadyExists, Forbidden, InvalidInput, PayloadTooLarge, RegionNotFound
from appliance.core.tensors import encode_bytes_tensor
from appliance.engine.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    SharedMemoryRef,
)
from appliance.protocol.shared_memory import LocalPeers, SharedMemoryLimits, SharedMemoryRegistry
from appliance.protocol.shared_memory.binding import bind
from appliance.protocol.shared_memory.table import RegionTable
from tests.descriptors import opened
from tests.waiting import await_until, next_turn


@pytest.fixture
def shm():
    registry = SharedMemoryRegistry("local", SharedMemoryLimits(), LocalPeers(["127.0.0.0/8"]))
    yield registry
    registry.close()


class Reservations(list):
    def __call__(self, size: int) -> None:
        self.append(size)


def _input(name: str, datatype: str, shape, region: str, byte_size: int, offset: int = 0) -> SharedMemoryInput:
    return SharedMemoryInput(name, datatype, tuple(shape), SharedMemoryRef(region, byte_size, offset))


def _region(shm, shm_object, name: str, data: bytes, size: int | None = None, offset: int = 0):
    key, memory = shm_object(size or len(data) + offset)
    memory.buf[offset:offset + len(data)] = data
    shm.system.register(name, key, 0, size or len(data) + offset, local=True)
    return key, memory


async def test_inputs_are_read_and_outputs_written(shm, shm_object):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    words = np.array([b"a", b"bc", b""], dtype=object)
    packed = encode_bytes_tensor(words)
    _region(shm, shm_object, "in", x.tobytes() + packed)
    out_key, out = shm_object(256)
    shm.system.register("out", out_key, 0, 256, local=True)
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("out", 200, 8)),
                                RequestedOutput("w")],
                           shared_inputs=[_input("x", "FP32", (3, 4), "in", 48),
                                          _input("s", "BYTES", (3,), "in", len(packed), 48)])
    reserved = Reservations()
    with await shm.bind(request, local=True, reserve=reserved) as binding:
        assert request.shared_inputs == [] and [i.name for i in request.inputs] == ["x", "s"]
        np.testing.assert_array_equal(request.inputs[0].data, x)
        assert list(request.inputs[1].data) == [b"a", b"bc", b""]
        response = InferResponse("m", 1, [InferOutput("y", "FP32", x * 2), InferOutput("w", "BYTES", words)])
        await binding.write(response)
    assert reserved[0] == 48 and reserved[1] >= len(packed)
    np.testing.assert_array_equal(np.frombuffer(out.buf, np.float32, 12, 8).reshape(3, 4), x * 2)
    assert response.outputs[0].shared_memory == SharedMemoryRef("out", 48, 8)
    assert response.outputs[1].shared_memory is None  # not asked for in shared memory: stays in the response


async def test_bf16_tensors_go_both_ways(shm, shm_object):
    x = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    _region(shm, shm_object, "in", x.tobytes())
    out_key, out = shm_object(64)
    shm.system.register("out", out_key, 0, 64, local=True)
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("out", 64))],
                           shared_inputs=[_input("x", "BF16", (1, 3), "in", 6)])
    with await shm.bind(request, local=True, reserve=Reservations()) as binding:
        assert request.inputs[0].data.dtype == ml_dtypes.bfloat16 and request.inputs[0].data.tolist() == x.tolist()
        await binding.write(InferResponse("m", 1, [InferOutput("y", "BF16", x * 2)]))
    assert np.frombuffer(out.buf, ml_dtypes.bfloat16, 3).tolist() == [3.0, -4.0, 6.5]


@pytest.mark.parametrize(("shape", "byte_size", "message"), [
    ((4,), 12, "needs 16 bytes, shared_memory_byte_size is 12"),
    ((1 << 40,), 16, "needs 4398046511104 bytes"),
    ((2,), 17, "needs 8 bytes"),
])
async def test_an_input_size_that_does_not_match_its_shape_is_refused_before_allocating(shm, shm_object, shape,
                                                                                       byte_size, message):
    _region(shm, shm_object, "in", bytes(64))
    reserved = Reservations()
    request = InferRequest([], shared_inputs=[_input("x", "INT32", shape, "in", byte_size)])
    with pytest.raises(InvalidInput, match=message):
        await shm.bind(request, local=True, reserve=reserved)
    assert reserved == []


async def test_bytes_inputs_are_checked_against_their_prefixes(shm, shm_object):
    _region(shm, shm_object, "in", encode_bytes_tensor(np.array([b"xy"], dtype=object)) + bytes(8))
    with pytest.raises(InvalidInput, match="holds 1 BYTES elements, the shape needs 10"):
        await shm.bind(InferRequest([], shared_inputs=[_input("s", "BYTES", (10,), "in", 8)]), local=True,
                       reserve=Reservations())
    with pytest.raises(InvalidInput, match="left over after 1 BYTES elements"):  # 6 bytes, then zeros
        await shm.bind(InferRequest([], shared_inputs=[_input("s", "BYTES", (1,), "in", 14)]), local=True,
                       reserve=Reservations())


@pytest.mark.parametrize(("offset", "byte_size", "message"), [
    (64, 4, "Invalid offset for shared memory region: 'in'"),
    (1 << 62, 4, "Invalid offset for shared memory region: 'in'"),
    (60, 8, "Invalid offset \\+ byte size for shared memory region: 'in'"),
    (0, 68, "Invalid offset \\+ byte size for shared memory region: 'in'"),
])
async def test_tensors_beyond_their_region_are_refused_on_every_use(shm, shm_object, offset, byte_size, message):
    key, _ = _region(shm, shm_object, "in", bytes(64))
    count = byte_size // 4
    for request in (InferRequest([], shared_inputs=[_input("x", "INT32", (count,), "in", byte_size, offset)]),
                    InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("in", byte_size, offset))])):
        with pytest.raises(InvalidInput, match=message) as caught:
            await shm.bind(request, local=True, reserve=Reservations())
        assert key.lstrip("/") not in caught.value.message
    shm.system.unregister(local=True)
    assert opened("self", key) == 2  # the test's SharedMemory and its mapping: no lease was left behind


async def test_an_output_larger_than_its_region_gets_tritons_error(shm, shm_object):
    _region(shm, shm_object, "out", bytes(16))
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("out", 16))])
    with await shm.bind(request, local=True, reserve=Reservations()) as binding:
        response = InferResponse("m", 1, [InferOutput("y", "FP32", np.zeros(5, np.float32))])
        with pytest.raises(InvalidInput) as caught:
            await binding.write(response)
    assert caught.value.message == ("shared memory size specified with the request for output 'y' (16 bytes) "
                                    "should be at least 20 bytes to hold the results")


async def test_outputs_that_cannot_go_to_a_region_are_refused(shm, shm_object):
    _region(shm, shm_object, "out", bytes(64))
    classified = RequestedOutput("y", {"classification": 2}, SharedMemoryRef("out", 64))
    twice = [RequestedOutput("y", shared_memory=SharedMemoryRef("out", 8)),
             RequestedOutput("y", shared_memory=SharedMemoryRef("out", 8, 8))]
    for outputs, message in (([classified], "classification results cannot go to shared memory"),
                             (twice, "requested more than once")):
        with pytest.raises(InvalidInput, match=message):
            await shm.bind(InferRequest([], outputs), local=True, reserve=Reservations())
    shm.system.unregister(local=True)
    assert shm.counts() == (0, 0)  # nothing left leased


async def test_unknown_regions_and_remote_clients(shm, shm_object):
    with pytest.raises(RegionNotFound, match="Unable to find shared memory region: 'nope'"):
        await shm.bind(InferRequest([], shared_inputs=[_input("x", "INT32", (1,), "nope", 4)]), local=True,
                       reserve=Reservations())
    _region(shm, shm_object, "in", bytes(16))
    with pytest.raises(Forbidden, match="client_shm = local"):
        await shm.bind(InferRequest([], shared_inputs=[_input("x", "INT32", (1,), "in", 4)]), local=False,
                       reserve=Reservations())


async def test_the_memory_budget_is_asked_before_reading(shm, shm_object):
    key, _ = _region(shm, shm_object, "in", bytes(64))

    def refuse(size: int) -> None:
        raise PayloadTooLarge("over the budget")

    with pytest.raises(PayloadTooLarge):
        await shm.bind(InferRequest([], shared_inputs=[_input("x", "INT32", (16,), "in", 64)]), local=True,
                       reserve=refuse)
    shm.system.unregister(local=True)
    assert opened("self", key) == 2


async def test_a_region_unregistered_during_a_request_stays_listed_until_the_request_is_done(shm, shm_object):
    # Triton (L0_shared_memory TestSharedMemoryUnregister): unregister succeeds, the region stays in
    # status (and its name taken) until the request using it ends, then it is gone without another call.
    key, memory = _region(shm, shm_object, "io", bytes(64))
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("io", 16, 16))])
    with await shm.bind(request, local=True, reserve=Reservations()) as binding:
        shm.system.unregister(local=True)
        assert [r["name"] for r in shm.system.status(local=True)] == ["io"] and opened("self", key) == 3
        with pytest.raises(AlreadyExists, match="'io' already in manager"):
            shm.system.register("io", key, 0, 8, local=True)
        await binding.write(InferResponse("m", 1, [InferOutput("y", "INT32", np.arange(4, dtype=np.int32))]))
    # The output went into the region the request named, which is unregistered and closed now.
    np.testing.assert_array_equal(np.frombuffer(memory.buf, np.int32, 4, 16), np.arange(4))
    assert shm.system.status(local=True) == [] and opened("self", key) == 2 and shm.counts() == (0, 0)
    with pytest.raises(RegionNotFound):
        shm.system.status("io", local=True)
    shm.system.register("io", key, 0, 8, local=True)  # the name is free again
    assert shm.counts() == (1, 8)


async def test_input_regions_stay_held_for_the_whole_request(shm, shm_object):
    key, _ = _region(shm, shm_object, "in", np.arange(4, dtype=np.int32).tobytes())
    request = InferRequest([], shared_inputs=[_input("x", "INT32", (4,), "in", 16)])
    with await shm.bind(request, local=True, reserve=Reservations()):
        np.testing.assert_array_equal(request.inputs[0].data, np.arange(4))
        shm.system.unregister("in", local=True)
        assert [r["name"] for r in shm.system.status(local=True)] == ["in"]
    assert shm.system.status(local=True) == [] and opened("self", key) == 2


async def test_a_region_awaiting_unregister_serves_new_requests_until_the_last_ends(shm, shm_object):
    # Triton lets a request name a region that is awaiting its unregister; the region goes when the last
    # request holding it ends (test_unregister_shm_during_inference_multiple_req).
    key, _ = _region(shm, shm_object, "in", np.arange(4, dtype=np.int32).tobytes())

    def request() -> InferRequest:
        return InferRequest([], shared_inputs=[_input("x", "INT32", (4,), "in", 16)])

    first = await shm.bind(request(), local=True, reserve=Reservations())
    shm.system.unregister(local=True)
    second_request = request()
    second = await shm.bind(second_request, local=True, reserve=Reservations())
    np.testing.assert_array_equal(second_request.inputs[0].data, np.arange(4))
    first.close()
    assert [r["name"] for r in shm.system.status(local=True)] == ["in"]  # the second still holds it
    shm.system.unregister(local=True)  # again, while held: still no error, still listed
    assert len(shm.system.status(local=True)) == 1
    second.close()
    assert shm.system.status(local=True) == [] and opened("self", key) == 2 and shm.counts() == (0, 0)


async def test_a_request_that_fails_to_bind_gives_every_region_back(shm, shm_object):
    _region(shm, shm_object, "in", bytes(16))
    bad = InferRequest([], shared_inputs=[_input("x", "INT32", (4,), "in", 16), _input("z", "INT32", (4,), "nope", 16)])
    with pytest.raises(RegionNotFound):
        await shm.bind(bad, local=True, reserve=Reservations())
    shm.system.unregister(local=True)
    assert shm.system.status(local=True) == [] and shm.counts() == (0, 0)


async def test_an_object_shrunk_after_registration_is_an_error_not_a_crash(shm, shm_object):
    key, memory = _region(shm, shm_object, "in", bytes(64))
    fd = os.open(f"/dev/shm{key}", os.O_RDWR)
    try:
        os.ftruncate(fd, 8)
    finally:
        os.close(fd)
    with pytest.raises(InvalidInput, match="smaller than the region"):
        await shm.bind(InferRequest([], shared_inputs=[_input("x", "INT32", (16,), "in", 64)]), local=True,
                       reserve=Reservations())
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("in", 64))])
    with await shm.bind(request, local=True, reserve=Reservations()) as binding, \
            pytest.raises(InvalidInput, match="smaller than the region"):
        await binding.write(InferResponse("m", 1, [InferOutput("y", "INT32", np.zeros(16, np.int32))]))
    assert os.fstat(memory._fd).st_size == 8  # the write did not grow it back


async def test_large_copies_run_off_the_loop(shm, shm_object):
    x = np.random.default_rng(0).random((2, 3, 256, 256)).astype(np.float32)  # 1.5 MiB: past the threshold
    _region(shm, shm_object, "in", x.tobytes())
    request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("in", x.nbytes))],
                           shared_inputs=[_input("x", "FP32", x.shape, "in", x.nbytes)])
    with await shm.bind(request, local=True, reserve=Reservations()) as binding:
        np.testing.assert_array_equal(request.inputs[0].data, x)
        await binding.write(InferResponse("m", 1, [InferOutput("y", "FP32", x + 1)]))
    np.testing.assert_array_equal(request.inputs[0].data, x)  # the input is the request's own copy
    assert shm.system.status(local=True)[0]["byte_size"] == x.nbytes


class SlowRegion:
    """A region whose copies wait for the test, and which notes a close that comes during a copy."""

    kind = "system"

    def __init__(self, byte_size: int) -> None:
        self.byte_size = byte_size
        self.copying = threading.Event()
        self.go_on = threading.Event()
        self.closed = False
        self.closed_while_copying = False

    def read(self, offset: int, out: memoryview) -> None:
        self._copy()

    def write(self, offset: int, data: memoryview) -> None:
        self._copy()

    def _copy(self) -> None:
        self.copying.set()
        self.go_on.wait(10)
        self.copying.clear()

    def status(self) -> dict:
        return {}

    def close(self) -> None:
        self.closed_while_copying = self.copying.is_set()
        self.closed = True


@pytest.mark.parametrize("direction", ["input", "output"])
async def test_a_cancelled_request_keeps_its_region_open_until_its_copy_ends(direction):
    table = RegionTable("local", SharedMemoryLimits())
    region = SlowRegion(4 << 20)
    table.add("slow", region.byte_size, lambda: region)
    size = 2 << 20  # off the loop
    if direction == "input":
        request = InferRequest([], shared_inputs=[_input("x", "UINT8", (size,), "slow", size)])
        copy = asyncio.ensure_future(bind(table, request, local=True, reserve=Reservations()))
    else:
        request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("slow", size))])
        binding = await bind(table, request, local=True, reserve=Reservations())
        response = InferResponse("m", 1, [InferOutput("y", "UINT8", np.zeros(size, np.uint8))])
        copy = asyncio.ensure_future(binding.write(response))
    assert await asyncio.to_thread(region.copying.wait, 10)
    copy.cancel()  # the request goes away while its copy runs on a worker thread
    with pytest.raises(asyncio.CancelledError):
        await copy
    if direction == "output":
        binding.close()
    table.remove("system")
    await next_turn()  # what the removal scheduled runs (a close under the copy is noted, whenever it comes)
    assert not region.closed  # the thread still copies: the region must stay open under it
    region.go_on.set()
    await await_until(lambda: region.closed, timeout=5, what="the region closed once its copy ended")
    assert not region.closed_while_copying
