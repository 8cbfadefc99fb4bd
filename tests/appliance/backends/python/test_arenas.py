"""What the Python backend keeps in /dev/shm between requests: arenas reused up to KEEP_BYTES, and one
large request's arenas gone once it has been answered (they used to stay, at twice its size, on both
sides of the channel), for plain and decoupled models."""

from __future__ import annotations

import os

import numpy as np
import pytest

from appliance.backends.base import BackendRequest
from appliance.backends.python.wire.arena import ARENA_PREFIX, KEEP_BYTES
from tests.appliance.backends.python.harness import RecordingSink, loaded
from tests.models import copy_model, read_config
from tests.processes import child_pids
from tests.waiting import wait_until

ECHO = "backends/arena_echo"
"""OUT is IN; ``arena_echo_decoupled`` sends it as its one response, decoupled."""
CONFIG = read_config(ECHO)

LARGE = (40 << 20) // 4
"""Elements of a 40 MiB FP32 request: well past what an arena may keep."""


def _shm_bytes(pids: set[int]) -> int:
    """Bytes /dev/shm holds in the arenas of ``pids`` (pages touched, as the kernel counts them)."""
    total = 0
    for entry in os.scandir("/dev/shm"):
        owner = entry.name.removeprefix(ARENA_PREFIX).split("-", 1)[0]
        if entry.name.startswith(ARENA_PREFIX) and owner.isdigit() and int(owner) in pids:
            try:
                total += entry.stat().st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _ours() -> set[int]:
    return {os.getpid(), *child_pids(os.getpid())}


def _settled_shm_bytes(limit: int, timeout: float = 5.0) -> int:
    """Our arenas' bytes once they are below ``limit``, or as they are at the timeout: the model process
    lets go of a one-off arena after its reply is read, which may come a moment after the caller has it."""

    def below() -> tuple[int] | None:
        held = _shm_bytes(_ours())
        return (held,) if held < limit else None

    try:
        return wait_until(below, timeout=timeout, interval=0.05)[0]
    except AssertionError:
        return _shm_bytes(_ours())  # the caller judges it


def _run(backend, values: np.ndarray, decoupled: bool) -> np.ndarray:
    sink = RecordingSink() if decoupled else None
    (result,) = backend.run_requests([BackendRequest({"IN": values}, ["OUT"], sink=sink)]).results
    assert not isinstance(result, BaseException), result
    if sink is None:
        return result["OUT"]
    return sink.wait_final()[0].outputs["OUT"]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="arenas live in /dev/shm only on Linux")
@pytest.mark.parametrize("decoupled", [False, True], ids=["plain", "decoupled"])
def test_a_large_request_leaves_no_arena_behind(tmp_path, decoupled):
    source = f"{ECHO}_decoupled" if decoupled else ECHO
    model = copy_model(tmp_path, source, "echo")
    config = read_config(source)
    with loaded(model, config) as backend:
        small = np.arange(16, dtype=np.float32)
        np.testing.assert_array_equal(_run(backend, small, decoupled), small)
        before = _shm_bytes(_ours())
        large = np.full(LARGE, 1.5, np.float32)
        assert _run(backend, large, decoupled).shape == (LARGE,)
        np.testing.assert_array_equal(_run(backend, small, decoupled), small)  # what serves on after it
        after = _settled_shm_bytes(before + KEEP_BYTES // 4)
        assert after < KEEP_BYTES and after - before < KEEP_BYTES // 4, (before, after)
        for _ in range(3):  # and it serves large requests again, each one's arenas let go of
            assert _run(backend, large, decoupled)[-1] == 1.5
        assert _settled_shm_bytes(KEEP_BYTES) < KEEP_BYTES


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="arenas live in /dev/shm only on Linux")
def test_small_streamed_responses_travel_in_their_messages(tmp_path):
    """A decoupled model's small responses carry their tensors themselves: no block segment is made, and
    none is read and given back, on either side of the channel."""
    model = copy_model(tmp_path, f"{ECHO}_decoupled", "echo")
    with loaded(model, read_config(f"{ECHO}_decoupled")) as backend:
        for values in (np.arange(16, dtype=np.float32), np.full(1000, 2.5, np.float32)):
            np.testing.assert_array_equal(_run(backend, values, decoupled=True), values)
        assert _shm_bytes(_ours()) == 0
        large = np.full(LARGE, 1.5, np.float32)  # a large one still goes through shared memory
        assert _run(backend, large, decoupled=True)[-1] == 1.5


def test_blocks_of_large_responses_come_back_while_execute_runs(tmp_path):
    """A decoupled model that streams large responses during one long execute() gets their blocks back as
    the daemon reads them: its process reads the daemon's Free messages meanwhile, rather than filling
    segment after segment until execute() returns."""
    model = copy_model(tmp_path, "backends/streams_large", "streams")
    with loaded(model, read_config("backends/streams_large")) as backend:
        sink = RecordingSink()
        values = np.full(1 << 16, 0.5, np.float32)  # 256 KiB: a block each
        backend.run_requests([BackendRequest({"IN": values}, ["OUT"], sink=sink)])
        *streamed, last = sink.wait_final()
        assert [s.outputs["OUT"].shape for s in streamed] == [values.shape] * 3
        assert last.outputs["OUT"].tolist() == [0.0]  # every block given back before execute() returned
