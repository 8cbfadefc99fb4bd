"""Blocks: overlapping messages' tensors in shared memory, freed by the reader; and ``carry``, which keeps
small ones in the message itself."""

from __future__ import annotations

import os

import numpy as np
import pytest

from appliance.backends.python.wire.arena import INLINE_BYTES, KEEP_BYTES, Arena, Attachments, Blocks, carry, taken


def test_blocks_are_reused_once_freed_and_bigger_segments_come_only_for_bigger_messages():
    blocks, reader = Blocks(), Attachments()
    try:
        small = [("a", np.arange(10, dtype=np.float32)), ("s", np.array([b"x", b"yz"], dtype=object))]
        first, descriptors = blocks.write(small)
        second, _ = blocks.write(small)
        assert first[1] == second[1] and first[0] != second[0]  # one segment, two live blocks
        got = reader.read(first, descriptors)
        assert got["a"].tolist() == list(range(10)) and got["s"].tolist() == [b"x", b"yz"]
        blocks.free(first[0])
        blocks.free(second[0])
        assert blocks.in_use == 0
        big = [("b", np.zeros(1 << 20, dtype=np.float32))]  # 4 MiB: more than a segment holds
        kept, _ = blocks.write(small)
        grown, big_descriptors = blocks.write(big)
        assert grown[1] != kept[1] and grown[2] > kept[2]
        assert reader.read(grown, big_descriptors)["b"].shape == (1 << 20,)
        blocks.free(kept[0])
        blocks.free(grown[0])
        again, _ = blocks.write(big)
        assert again[1] == grown[1]  # the emptied segment is reused from its start
    finally:
        reader.close()
        blocks.close()


def test_a_steady_stream_cycles_through_a_few_segments():
    """A writer always one block ahead of its reader (a decoupled model streaming to a slow client)
    never lets a segment empty while it writes into it: it must not grow for ever."""
    blocks = Blocks()
    try:
        payload = [("r", np.zeros(64 * 1024, dtype=np.uint8))]
        previous, _ = blocks.write(payload)
        paths = set()
        for _ in range(2000):
            ref, _ = blocks.write(payload)
            blocks.free(previous[0])
            previous = ref
            paths.add(ref[1])
            assert ref[2] <= 1 << 20
        live = {p for p in paths if os.path.exists(p)}
        assert len(live) <= 1 + Blocks.SPARE
    finally:
        blocks.close()


def test_an_oversized_message_gets_a_segment_of_its_own_removed_once_freed():
    blocks, reader = Blocks("big"), Attachments()
    try:
        small = [("a", np.arange(10, dtype=np.float32))]
        kept, _ = blocks.write(small)
        large = [("b", np.ones(KEEP_BYTES // 4 + 16, dtype=np.float32))]  # just past KEEP_BYTES
        ref, descriptors = blocks.write(large)
        assert ref[1] != kept[1] and ref[2] == Arena.needed(large)  # exactly its size, not twice
        assert reader.read(ref, descriptors)["b"][-1] == 1.0
        blocks.free(ref[0])
        assert not os.path.exists(ref[1])  # gone at once, not kept as a spare
        after, _ = blocks.write(small)
        assert after[1] == kept[1] and after[2] <= KEEP_BYTES  # small messages stay in the kept segment
    finally:
        reader.close()
        blocks.close()


def test_segments_kept_for_reuse_never_grow_past_keep_bytes():
    blocks = Blocks()
    try:
        near = [("c", np.zeros(KEEP_BYTES // 4 - 1024, dtype=np.float32))]  # just under KEEP_BYTES
        ref, _ = blocks.write(near)
        assert Arena.needed(near) <= ref[2] <= KEEP_BYTES
        blocks.free(ref[0])
    finally:
        blocks.close()


def test_carry_keeps_small_tensors_in_the_message_and_puts_the_rest_in_a_block():
    blocks, reader = Blocks(), Attachments()
    try:
        small = [("a", np.arange(6, dtype=np.int32).reshape(2, 3)), ("b", np.array([True, False]))]
        ref, descriptors = carry(blocks, small)
        assert ref is None and blocks.in_use == 0
        got = taken(reader, ref, descriptors)
        assert got["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and got["b"].tolist() == [True, False]
        got["a"][0, 0] = 7  # the reader's array is its own, and writable, as one copied out of a block
        assert small[0][1][0, 0] == 0
        assert carry(blocks, []) == (None, [])
        for tensors in ([("big", np.zeros(INLINE_BYTES // 4 + 1, np.float32))],  # too large together
                        [("s", np.array([b"x", b"yz"], dtype=object))]):  # BYTES: sized once serialised
            ref, descriptors = carry(blocks, tensors)
            assert ref is not None
            name, array = tensors[0]
            assert taken(reader, ref, descriptors)[name].tolist() == array.tolist()
            blocks.free(ref[0])
        assert blocks.in_use == 0
    finally:
        reader.close()
        blocks.close()


def test_taken_refuses_descriptors_that_do_not_add_up():
    blocks, reader = Blocks(), Attachments()
    try:
        _, in_block = blocks.write([("a", np.arange(4, dtype=np.float32))])
        with pytest.raises(ValueError, match="in an arena, but the message names none"):
            taken(reader, None, in_block)
        _, carried = carry(blocks, [("a", np.arange(4, dtype=np.float32))])
        name, datatype, shape, offset, raw = carried[0]
        with pytest.raises(ValueError, match="carries 16 bytes, not 20"):
            taken(reader, None, [(name, datatype, (5,), offset, raw)])
        with pytest.raises(ValueError, match="not carried as an inline tensor is"):
            taken(reader, None, [(name, datatype, shape, offset, bytes(raw))])
    finally:
        reader.close()
        blocks.close()
