"""The allocator's thresholds, in a process of their own (mallopt is process-wide): a large buffer gets
a mapping of its own that goes back when freed, and a heap keeps a few MiB of free top for reuse."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(ctypes.util.find_library("c") is None or not hasattr(ctypes.CDLL(
    ctypes.util.find_library("c") or ""), "mallinfo2"), reason="glibc 2.33 or later (mallinfo2) is needed")

_PROBE = r"""
import ctypes, ctypes.util, json, sys
from appliance.runtime.allocator import KEPT_FREE_BYTES, LARGE_BUFFER_BYTES, tune_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = MallInfo2
tuned = tune_allocator(kept=int(sys.argv[1]) or KEPT_FREE_BYTES)
before = libc.mallinfo2().hblkhd
large = libc.malloc(2 * LARGE_BUFFER_BYTES)
held = libc.mallinfo2().hblkhd - before
libc.free(large)
blocks = [libc.malloc(512 * 1024) for _ in range(6)]  # 3 MiB of a request's buffers, under the threshold
for block in blocks:
    ctypes.memset(block, 1, 512 * 1024)
for block in reversed(blocks):
    libc.free(block)
info = libc.mallinfo2()
print(json.dumps({"tuned": tuned, "large_held": held, "large_after": info.hblkhd - before, "kept": info.keepcost}))
"""


def _probe(kept: int) -> dict:
    """The thresholds set with ``kept`` (0: the default), a large buffer and 3 MiB of smaller ones."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(kept)], capture_output=True, text=True, check=True,
                         timeout=60)
    return json.loads(out.stdout)


def test_a_large_buffer_is_mapped_alone_and_a_heap_keeps_what_a_request_freed():
    tuned = _probe(0)
    assert tuned["tuned"]
    assert tuned["large_held"] >= 2 << 20 and tuned["large_after"] == 0  # returned as soon as it was freed
    assert tuned["kept"] >= 3 << 20  # the freed 3 MiB stay at the heap's top for the next request


def test_with_glibcs_trim_threshold_the_heap_shrinks_under_each_request():
    """The fixed mmap threshold alone (as before: the trim threshold at glibc's 128 KiB), for contrast:
    the heap gives back what the request freed, and the next request faults it in again."""
    shrunk = _probe(128 * 1024)
    assert shrunk["tuned"] and shrunk["large_after"] == 0 and shrunk["kept"] < 1 << 20  # of the 3 MiB freed
