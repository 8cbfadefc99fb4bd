"""Tensors through shared memory: a file in /dev/shm mapped by both processes.

The writer packs tensors into the arena and sends only descriptors (name, datatype, shape, offset,
size) through the control pipe; large arrays are never pickled. An arena that is too small is replaced
by a bigger one, whose path travels with the next descriptor.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import numpy as np

from appliance.core.bytes_tensor import decode_bytes_tensor, encode_bytes_tensor
from appliance.core.datatypes import numpy_dtype, v2_datatype

__all__ = ["ARENA_PREFIX", "Arena", "Descriptor"]

Descriptor = tuple[str, str, tuple[int, ...], int, int]
"""(name, v2 datatype, shape, offset, size in bytes)"""

_ALIGN = 64
ARENA_PREFIX = "appliance-"
"""Every arena's file name starts so; shared-memory registration refuses keys that do."""
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _raw(array: np.ndarray) -> bytes | np.ndarray:
    if array.dtype == object:
        return encode_bytes_tensor(array)
    return np.ascontiguousarray(array)


class Arena:
    """One shared-memory region; the owner creates (and removes) it, the peer attaches by path."""

    def __init__(self, path: str, size: int, owner: bool) -> None:
        self.path, self.size, self.owner = path, size, owner
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if owner else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if owner:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    @classmethod
    def create(cls, size: int) -> "Arena":
        fd, path = tempfile.mkstemp(prefix=ARENA_PREFIX, dir=_SHM_DIR)
        os.close(fd)
        os.unlink(path)
        return cls(path, max(_aligned(size), 1 << 16), owner=True)

    @classmethod
    def attach(cls, path: str, size: int) -> "Arena":
        return cls(path, size, owner=False)

    def close(self) -> None:
        self._map.close()
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    @staticmethod
    def needed(tensors: list[tuple[str, np.ndarray]]) -> int:
        return sum(_aligned(len(_raw(a)) if a.dtype == object else a.nbytes) for _, a in tensors)

    def write(self, tensors: list[tuple[str, np.ndarray]], offset: int = 0) -> tuple[list[Descriptor], int]:
        """Pack tensors from ``offset``; returns their descriptors and the next free offset."""
        descriptors = []
        for name, array in tensors:
            raw = _raw(array)
            size = len(raw) if isinstance(raw, bytes) else raw.nbytes
            if offset + size > self.size:
                raise ValueError("arena too small")  # callers size the arena with needed() first
            target = np.frombuffer(self._map, dtype=np.uint8, count=size, offset=offset)
            target[:] = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else raw.reshape(-1).view(np.uint8)
            descriptors.append((name, v2_datatype(array.dtype), tuple(array.shape), offset, size))
            offset = _aligned(offset + size)
        return descriptors, offset

    def read(self, descriptor: Descriptor, copy: bool) -> np.ndarray:
        """The tensor a descriptor names; ``copy`` detaches it from the arena (which will be reused)."""
        name, datatype, shape, offset, size = descriptor
        count = int(np.prod(shape)) if shape else 1
        if datatype == "BYTES":
            return decode_bytes_tensor(memoryview(self._map)[offset : offset + size], count, name).reshape(shape)
        array = np.frombuffer(self._map, dtype=numpy_dtype(datatype), count=count, offset=offset).reshape(shape)
        return array.copy() if copy else array

    def info(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size}
