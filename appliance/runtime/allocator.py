"""The C allocator's handling of freed memory, set once when the daemon starts.

Large buffers: glibc serves an allocation above its mmap threshold (128 KiB) with a mapping of its own
and unmaps it on free, but raises the threshold to the size of each such block freed (up to 32 MiB):
after the first large request, request bodies, messages and tensors come from the heaps of the threads
that made them, and a heap gives memory back only from its top. A daemon that once held a few large
requests at once then keeps that much resident for good, per thread that touched them (measured: 24
concurrent 16 MiB gRPC messages against a 32 MiB budget peaked 130 MiB higher, and stayed there). A
fixed threshold keeps large buffers in mappings of their own, returned to the system as soon as they are
freed.

Smaller buffers: fixing the mmap threshold also fixes glibc's trim threshold at its default, 128 KiB: a
heap whose free top passes it is shrunk at once. A request of a few hundred KiB (a 762 KB JSON body, its
joined copy, its tensors) then grows the heap, faulting in fresh zeroed pages, and shrinks it again when
it ends, every request: 20 % of the daemon's CPU on the CNN over JSON (perf: page faults under memmove,
brk and munmap). A heap keeps up to ``KEPT_FREE_BYTES`` of free top for the next request instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["KEPT_FREE_BYTES", "LARGE_BUFFER_BYTES", "tune_allocator"]

log = logging.getLogger(__name__)

LARGE_BUFFER_BYTES = 1 << 20
"""Buffers from this size up are mapped on their own (a fixed glibc mmap threshold)."""
KEPT_FREE_BYTES = 4 << 20
"""Free memory at a heap's top that glibc keeps mapped for the next allocations (its trim threshold):
the CNN over JSON at c=1, the same plan each way, 7.5 ms of CPU a request against 9.3 at 128 KiB (6.6
against 8.1 pinned to one core), and no better at 32 MiB (``bench/results/NOTES.md``, ninth session)."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator(large: int = LARGE_BUFFER_BYTES, kept: int = KEPT_FREE_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``large`` and its trim threshold at ``kept``; False where the C
    library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, large) != 1 or mallopt(_M_TRIM_THRESHOLD, kept) != 1:
        log.warning("could not set the allocator's thresholds: large request buffers may stay resident, and "
                    "requests of a few hundred KiB cost page faults")
        return False
    return True
