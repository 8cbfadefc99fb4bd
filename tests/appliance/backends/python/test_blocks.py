"""Blocks: overlapping messages' tensors in shared memory, freed by the reader."""

from __future__ import annotations

import os

import numpy as np

from appliance.backends.python.arena import Attachments, Blocks


def test_blocks_are_reused_once_freed_and_retired_when_outgrown():
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
        big = [("b", np.zeros(1 << 20, dtype=np.float32))]  # 4 MiB: a bigger segment follows
        kept, _ = blocks.write(small)
        grown, big_descriptors = blocks.write(big)
        assert grown[1] != kept[1] and grown[2] > kept[2]
        assert reader.read(grown, big_descriptors)["b"].shape == (1 << 20,)
        blocks.free(kept[0])  # the outgrown segment's last block: it is removed
        assert not os.path.exists(kept[1])
        blocks.free(grown[0])
        again, _ = blocks.write(big)
        assert again[1] == grown[1]  # the live segment is reused from the start
    finally:
        reader.close()
        blocks.close()
