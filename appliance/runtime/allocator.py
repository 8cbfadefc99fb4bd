"""The C allocator's handling of large buffers, set once when the daemon starts.

glibc serves an allocation above its mmap threshold (128 KiB) with a mapping of its own and unmaps it on
free, but raises the threshold to the size of each such block freed (up to 32 MiB): after the first
large request, request bodies, messages and tensors come from the heaps of the threads that made them,
and a heap gives memory back only from its top. A daemon that once held a few large requests at once
then keeps that much resident for good, per thread that touched them (measured: 24 concurrent 16 MiB
gRPC messages against a 32 MiB budget peaked 130 MiB higher, and stayed there). A fixed threshold keeps
large buffers in mappings of their own, returned to the system as soon as they are freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["LARGE_BUFFER_BYTES", "return_large_buffers"]

log = logging.getLogger(__name__)

LARGE_BUFFER_BYTES = 1 << 20
"""Buffers from this size up are mapped on their own (a fixed glibc mmap threshold)."""
_M_MMAP_THRESHOLD = -3


def return_large_buffers(threshold: int = LARGE_BUFFER_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold``; False where the C library is not glibc."""
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
    if mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        log.warning("could not fix the allocator's mmap threshold: large request buffers may stay resident")
        return False
    return True
