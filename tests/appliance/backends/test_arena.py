"""Shared-memory arenas between the daemon and Python model processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.backends.python.wire.arena import (
    ARENA_PREFIX,
    INLINE_BYTES,
    KEEP_BYTES,
    Arena,
    arena_usage,
    inline,
    read_tensor,
    remove_stale_arenas,
    reusable_size,
)
from appliance.backends.python.wire.messages import Execute, decode, encode
from tests.waiting import wait_until


def test_arenas_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / f"{ARENA_PREFIX}{dead}-abc").write_bytes(b"x")
    (tmp_path / f"{ARENA_PREFIX}{os.getpid()}-def").write_bytes(b"x")  # ours: alive
    (tmp_path / f"{ARENA_PREFIX}oldstyle").write_bytes(b"x")  # no owner to check: kept
    (tmp_path / "other").write_bytes(b"x")
    assert remove_stale_arenas(str(tmp_path)) == [f"{ARENA_PREFIX}{dead}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{ARENA_PREFIX}{os.getpid()}-def", f"{ARENA_PREFIX}oldstyle", "other"])


def test_an_arena_names_its_creator():
    arena = Arena.create(1024)
    try:
        assert os.path.basename(arena.path).startswith(f"{ARENA_PREFIX}{os.getpid()}-")
    finally:
        arena.close()


def test_arenas_of_exited_but_unreaped_processes_are_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z",
               timeout=30, what="the child exited, not yet waited for: a zombie")
    (tmp_path / f"{ARENA_PREFIX}{child.pid}-abc").write_bytes(b"x")
    try:
        assert remove_stale_arenas(str(tmp_path)) == [f"{ARENA_PREFIX}{child.pid}-abc"]
    finally:
        child.wait()


def test_arenas_are_sized_with_room_to_spare_up_to_what_is_kept():
    assert reusable_size(1000) == 1 << 16  # the smallest arena
    assert reusable_size(1 << 20) == 2 << 20  # room for a larger next message
    assert reusable_size(KEEP_BYTES - 64) == KEEP_BYTES  # the spare is capped
    assert reusable_size(KEEP_BYTES + 1) == KEEP_BYTES + 64  # past the cap: exactly its size (aligned)
    arena = Arena.create(1024)
    try:
        assert not arena.oversized
    finally:
        arena.close()


def test_arena_usage_counts_the_pages_of_the_given_processes_by_model(tmp_path):
    (tmp_path / f"{ARENA_PREFIX}{os.getpid()}-resnet-v2-abc123").write_bytes(b"x" * 8192)
    (tmp_path / f"{ARENA_PREFIX}{os.getpid()}-resnet-v2-def456").write_bytes(b"x" * 4096)
    (tmp_path / f"{ARENA_PREFIX}{os.getpid()}-bls-ghi789").write_bytes(b"x")
    (tmp_path / f"{ARENA_PREFIX}1-other-abc").write_bytes(b"x" * 4096)  # not one of ours
    usage = arena_usage({os.getpid()}, str(tmp_path))
    assert set(usage) == {"resnet-v2", "bls"}
    assert usage["resnet-v2"] >= 12288 and 0 < usage["bls"] < 12288


def test_an_arena_names_the_model_it_serves():
    arena = Arena.create(1024, "my model/1")
    try:
        name = os.path.basename(arena.path)
        assert name.startswith(f"{ARENA_PREFIX}{os.getpid()}-my_model_1-")
        assert arena_usage({os.getpid()}, os.path.dirname(arena.path)).get("my_model_1", -1) >= 0
    finally:
        arena.close()


def test_small_tensors_travel_in_the_message_and_come_out_writable_and_equal():
    parts = [[("a", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.array(7, np.int64))],
             [("a", np.arange(4, dtype=np.int32)[::2])]]  # not contiguous: copied contiguous
    carried = inline(parts)
    assert carried is not None
    sent = decode(encode(Execute(None, [(key, descriptors, [], "", 0, 0, 0, "{}")
                                        for key, descriptors in enumerate(carried)])))
    for part, item in zip(parts, sent.batch):
        for (name, array), descriptor in zip(part, item[1]):
            read = read_tensor(None, descriptor, copy=False)
            assert descriptor[0] == name and read.dtype == array.dtype
            np.testing.assert_array_equal(read, array)
            read[...] = 0  # a model may write into its inputs, as into an arena's
            assert not np.any(read)


def test_an_array_subclass_travels_inline_as_its_data():
    """A masked array's own tobytes writes its fill value where it is masked; inline carries the data, as
    the arena does for a large one."""
    masked = np.ma.masked_invalid(np.array([1.0, np.nan, 3.0], np.float32))
    (descriptor,), = inline([[("m", masked)]])
    read = read_tensor(None, descriptor, copy=False)
    assert read[0] == 1.0 and np.isnan(read[1]) and read[2] == 3.0
    fortran = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    (descriptor,), = inline([[("f", fortran)]])
    assert np.array_equal(read_tensor(None, descriptor, copy=False), fortran)


def test_large_or_bytes_tensors_go_through_an_arena():
    assert inline([[("a", np.zeros(INLINE_BYTES // 4 + 1, np.float32))]]) is None
    half = INLINE_BYTES // 8  # FP32 elements in half of it
    assert inline([[("a", np.zeros(half, np.float32))], [("b", np.zeros(half + 1, np.float32))]]) is None
    assert inline([[("s", np.array([b"x"], dtype=object))]]) is None


@pytest.mark.parametrize("descriptor", [
    ("a", "FP32", (4,), -1, bytearray(12)),  # fewer bytes than its shape needs
    ("a", "FP32", (2,), -1, bytearray(12)),  # more
    ("a", "FP32", (1,), -1, b"abcd"),  # not a bytearray
    ("a", "BYTES", (1,), -1, bytearray(4)),  # BYTES never travel inline
    ("a", "FP32", (1,), 0, 4),  # in an arena, but the message names none
])
def test_an_inline_descriptor_that_does_not_add_up_is_refused(descriptor):
    with pytest.raises(ValueError):
        read_tensor(None, descriptor, copy=False)
    name, datatype, shape, _, _ = descriptor
    if datatype == "FP32":  # refused just as well after a good tensor of that form was read
        good = read_tensor(None, (name, datatype, shape, -1, bytearray(4 * shape[0])), copy=False)
        assert good.shape == shape and good.dtype == np.float32
        with pytest.raises(ValueError):
            read_tensor(None, descriptor, copy=False)


@settings(max_examples=300, deadline=None)
@given(datatype=st.sampled_from(["FP32", "INT8", "UINT64", "BOOL", "FP16", "BYTES", "NOPE"]),
       shape=st.lists(st.integers(-3, 1 << 40), max_size=4).map(tuple),
       raw=st.binary(max_size=64).map(bytearray))
def test_any_inline_descriptor_reads_as_its_bytes_or_is_refused(datatype, shape, raw):
    """Whatever a model process sends as an inline tensor: an array holding exactly its bytes, or a
    ValueError; never an allocation its shape claims."""
    try:
        array = read_tensor(None, ("t", datatype, shape, -1, raw), copy=False)
    except ValueError:
        return
    assert array.nbytes == len(raw) and array.shape == shape


_SMALL_ARRAYS = st.one_of(
    st.integers(0, 3000).map(lambda n: np.arange(n, dtype=np.float32)),
    st.integers(0, 3000).map(lambda n: np.ones(n, np.int64)),
    st.integers(0, 3).map(lambda n: np.array([b"x"] * n, dtype=object)),
)


@given(parts=st.lists(st.lists(st.tuples(st.sampled_from("abc"), _SMALL_ARRAYS), max_size=3), max_size=4))
def test_a_batch_travels_inline_exactly_when_it_is_numeric_and_small_enough_together(parts):
    """``inline`` carries the whole batch or none of it: none where any tensor holds objects or all of them
    together pass INLINE_BYTES, else each tensor as itself."""
    arrays = [array for part in parts for _, array in part]
    carried = inline(parts)
    if any(array.dtype.hasobject for array in arrays) or sum(array.nbytes for array in arrays) > INLINE_BYTES:
        assert carried is None
        return
    assert carried is not None and [len(item) for item in carried] == [len(part) for part in parts]
    for part, item in zip(parts, carried):
        for (name, array), descriptor in zip(part, item):
            assert descriptor[0] == name and np.array_equal(read_tensor(None, descriptor, copy=False), array)
