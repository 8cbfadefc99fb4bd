"""Tensors through shared memory: a file in /dev/shm mapped by both processes.

The writer packs tensors into the arena and sends only descriptors (name, datatype, shape, offset,
size) through the control pipe; large arrays are never pickled. An arena that is too small is replaced
by a bigger one, whose path travels with the next descriptor.

Arenas live outside the request memory budget, so what stays between requests is capped: an arena
(or a Blocks segment) is kept for reuse only up to ``KEEP_BYTES``, sized with room to spare up to that
cap (``reusable_size``). A message that needs more gets an arena of its own, exactly its size, which
both sides let go of as soon as it has been read (``Arena.oversized``): one large request no longer
leaves its arenas in /dev/shm. A file's name says whose it is (``appliance-<pid>-<model>-…``):
``arena_usage`` sums them per model for /metrics.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import re
import threading
from typing import Any

import numpy as np

from appliance.core.tensors import decode_bytes_tensor, encode_bytes_tensor, numpy_dtype, v2_datatype

__all__ = ["ARENA_PREFIX", "INLINE_BYTES", "KEEP_BYTES", "Arena", "Attachments", "BlockRef", "Blocks", "Descriptor",
           "arena_usage", "carry", "inline", "pack", "read_tensor", "remove_stale_arenas", "reusable_size", "taken"]

Descriptor = tuple[str, str, tuple[int, ...], int, "int | bytearray"]
"""(name, v2 datatype, shape, offset, size in bytes); a tensor carried in the message itself (``inline``):
offset -1 and its bytes in place of the size."""

_ALIGN = 64
ARENA_PREFIX = "appliance-"
"""Every arena's file name starts so; shared-memory registration refuses keys that do."""
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
KEEP_BYTES = 16 << 20
"""The largest arena kept for reuse between messages; a larger one carries one message and goes."""
_MIN_BYTES = 1 << 16
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


INLINE_BYTES = 16 * 1024
"""Tensors of one message up to this many bytes together travel in the message itself (``inline``): for
a small tensor the arena's bookkeeping on both sides (sizing, a view of the map, the copy in and out,
letting go) costs more than the bytes in the pipe (docs/performance.md, "The hop")."""


def inline(tensors: list[list[tuple[str, np.ndarray]]]) -> list[list[Descriptor]] | None:
    """Descriptors that carry each message part's tensors themselves (a bytearray: the reader's array is
    writable, as one in an arena is), or None when they are too large together, or hold BYTES (sized only
    once serialized): those go through an arena."""
    total = 0
    carried = []
    for part in tensors:  # (one pass of plain loops: every batch, BLS call and streamed response comes here)
        descriptors: list[Descriptor] = []
        for name, array in part:
            dtype = array.dtype
            total += array.nbytes
            if dtype.hasobject or total > INLINE_BYTES:  # (checked before each copy: at most the bound copied)
                return None
            # ndarray's own tobytes (C order, one step): a subclass's may differ (a masked array writes its fill
            # value)
            descriptors.append((name, v2_datatype(dtype), array.shape, -1, bytearray(np.ndarray.tobytes(array))))
        carried.append(descriptors)
    return carried


def pack(tensors: list[list[tuple[str, np.ndarray]]], arena: Arena | None, model: str,
         carried: list[list[Descriptor]] | None = None,
         ) -> tuple[list[list[Descriptor]], Arena | None, dict[str, Any] | None]:
    """Each message part's tensors as descriptors (both sides' one way): carried inline when small
    (``inline``; ``carried``: what it made of them already, where the caller asked it first), else written
    into ``arena``, which a larger one replaces (the old one closed) when it is too small. Also the arena
    (as given, or its replacement) and its ``info()`` for the message, None when the tensors travel inline."""
    if carried is None:
        carried = inline(tensors)
    if carried is not None:
        return carried, arena, None
    needed = sum(Arena.needed(part) for part in tensors)
    if arena is None or arena.size < needed:
        if arena is not None:
            arena.close()
        arena = Arena.create(reusable_size(needed), model)
    carried, offset = [], 0
    for part in tensors:
        descriptors, offset = arena.write(part, offset)
        carried.append(descriptors)
    return carried, arena, arena.info()


def read_tensor(arena: Arena | None, descriptor: Descriptor, copy: bool) -> np.ndarray:
    """The tensor a descriptor names: carried inline, or in ``arena`` (``copy`` detaches it from the arena,
    which will be reused). Descriptors come from the other process: one that does not add up is a
    ValueError."""
    if descriptor[3] >= 0:
        if arena is None:
            raise ValueError(f"tensor '{descriptor[0]}' is in an arena, but the message names none")
        return arena.read(descriptor, copy)
    name, datatype, shape, _, raw = descriptor
    if type(raw) is not bytearray or datatype == "BYTES":
        raise ValueError(f"tensor '{name}' is not carried as an inline tensor is")
    dtype = numpy_dtype(datatype)
    count = math.prod(shape)
    if count * dtype.itemsize != len(raw):
        raise ValueError(f"tensor '{name}' of shape {list(shape)} carries {len(raw)} bytes, not "
                         f"{count * dtype.itemsize}")
    return np.ndarray(shape, dtype, raw)  # a view of its bytes, shaped: one array (frombuffer, reshape: two)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def reusable_size(needed: int) -> int:
    """The size of a new arena for ``needed`` bytes: twice that (room for the next, larger message)
    up to ``KEEP_BYTES``; exactly ``needed`` past it (an arena used once, then let go of)."""
    if needed > KEEP_BYTES:
        return _aligned(needed)
    return min(max(_aligned(needed * 2), _MIN_BYTES), KEEP_BYTES)


def _temporary_dir() -> str:
    import tempfile  # only where there is no /dev/shm

    return tempfile.gettempdir()


def _label(model: str) -> str:
    return _LABEL_UNSAFE.sub("_", model)[:64]


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
    def create(cls, size: int, model: str = "") -> Arena:
        """An arena of ``size`` bytes (see ``reusable_size``), named for the model it serves."""
        # The creator's pid in the name: a later start can tell arenas whose owner died (SIGKILL, a
        # crash) from those of a daemon still running, and remove them.
        # A random name the constructor creates exclusively (O_EXCL), as tempfile.mkstemp would: without
        # tempfile, which a model process otherwise does not load.
        directory = _SHM_DIR or _temporary_dir()
        for _ in range(8):
            path = os.path.join(directory, f"{ARENA_PREFIX}{os.getpid()}-{_label(model)}-{os.urandom(6).hex()}")
            try:
                return cls(path, max(_aligned(size), _MIN_BYTES), owner=True)
            except FileExistsError:
                continue
        raise FileExistsError(f"no free arena name in {directory} after 8 tries")

    @classmethod
    def attach(cls, path: str, size: int) -> Arena:
        return cls(path, size, owner=False)

    @property
    def oversized(self) -> bool:
        """Larger than an arena kept for reuse: let go of once its message has been read."""
        return self.size > KEEP_BYTES

    def release(self) -> None:
        """Unmap, leaving the file to the peer that reads it last (it removes the file)."""
        try:
            self._map.close()
        except BufferError:  # arrays still view it (a model kept an input): unmapped when they go
            pass

    def close(self) -> None:
        self.release()
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
        descriptors: list[Descriptor] = []
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
        if type(size) is not int:
            raise ValueError(f"tensor '{name}': its size in the arena is not a number")
        count = math.prod(shape)  # not np.prod: several µs on a tuple this small
        if datatype == "BYTES":
            return decode_bytes_tensor(memoryview(self._map)[offset : offset + size], count, name).reshape(shape)
        array = np.frombuffer(self._map, dtype=numpy_dtype(datatype), count=count, offset=offset).reshape(shape)
        return array.copy() if copy else array

    def info(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size}


def remove_stale_arenas(directory: str | None = _SHM_DIR) -> list[str]:
    """Remove the arenas of processes that no longer exist (blocking); the names removed."""
    if directory is None:
        return []
    removed = []
    for name in os.listdir(directory):
        owner = name.removeprefix(ARENA_PREFIX).split("-", 1)[0]
        if not name.startswith(ARENA_PREFIX) or not owner.isdigit() or _alive(int(owner)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:  # another user's, or gone already
            pass
    return removed


def arena_usage(pids: set[int], directory: str | None = _SHM_DIR) -> dict[str, int]:
    """Bytes of shared memory the arenas of processes ``pids`` take, by model (blocking: a directory
    scan). Pages count as they are touched, as the kernel counts them, not by the size reserved."""
    usage: dict[str, int] = {}
    if directory is None:
        return usage
    with os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if not name.startswith(ARENA_PREFIX):
                continue
            owner, _, rest = name.removeprefix(ARENA_PREFIX).partition("-")
            if not owner.isdigit() or int(owner) not in pids:
                continue
            try:
                used = entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:  # removed meanwhile
                continue
            model = rest.rpartition("-")[0]
            usage[model] = usage.get(model, 0) + used
    return usage


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has exited but not been reaped yet (a model process orphaned by a daemon killed
    with SIGKILL, until init collects it): its arenas are stale already."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


BlockRef = tuple[int, str, int]
"""(block id, arena path, arena size): what a reader needs to find one message's tensors."""


class _Segment:
    def __init__(self, size: int, model: str) -> None:
        self.arena = Arena.create(size, model)
        self.top = 0
        self.live = 0


class Blocks:
    """The writer's side of messages that overlap (streamed responses, BLS calls in flight at once):
    each message's tensors that are too large to travel in it (``carry``) go into a block of a shared
    segment, and the block stays untouched until the reader says it is done with it (``free``). A full
    segment is followed by another of the same size (bigger only for a message that does not fit, up to
    ``KEEP_BYTES``), and a segment whose blocks are all free is reused from its start, so a steady
    stream cycles through a few segments instead of growing. A message larger than ``KEEP_BYTES`` gets a
    segment of its own, removed once it is freed."""

    SPARE = 2
    """Free segments kept for reuse beside the current one; more are removed."""

    def __init__(self, model: str = "") -> None:
        self._model = model
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        """Oldest first; the last one is current."""
        self._one_offs: set[_Segment] = set()
        """Segments of one oversized message each, removed when it is freed."""
        self._blocks: dict[int, _Segment] = {}
        self._ids = itertools.count(1)

    def write(self, tensors: list[tuple[str, np.ndarray]]) -> tuple[BlockRef, list[Descriptor]]:
        needed = max(Arena.needed(tensors), _ALIGN)
        with self._lock:
            if needed > KEEP_BYTES:
                segment = _Segment(needed, self._model)
                self._one_offs.add(segment)
            else:
                segment = self._segment_for(needed)
            descriptors, end = segment.arena.write(tensors, segment.top)
            segment.top = max(end, segment.top + _ALIGN)
            segment.live += 1
            block = next(self._ids)
            self._blocks[block] = segment
            return (block, segment.arena.path, segment.arena.size), descriptors

    def _segment_for(self, needed: int) -> _Segment:
        current = self._segments[-1] if self._segments else None
        if current is not None:
            if current.live == 0:
                current.top = 0
            if current.top + needed <= current.arena.size:
                return current
        for segment in self._segments:  # an emptied one that fits: reuse it from its start
            if segment is not current and segment.live == 0 and needed <= segment.arena.size:
                self._segments.remove(segment)
                self._segments.append(segment)
                segment.top = 0
                return segment
        size = current.arena.size if current is not None else 1 << 20
        segment = _Segment(max(size, reusable_size(needed)), self._model)
        self._segments.append(segment)
        self._trim()
        return segment

    def _trim(self) -> None:
        """Remove free segments beyond SPARE (the smallest first: they are the least useful)."""
        free = sorted((s for s in self._segments[:-1] if s.live == 0), key=lambda s: s.arena.size)
        for segment in free[: max(0, len(free) - self.SPARE)]:
            self._segments.remove(segment)
            segment.arena.close()

    def free(self, block: int) -> None:
        with self._lock:
            segment = self._blocks.pop(block, None)
            if segment is None:
                return
            segment.live -= 1
            if segment.live > 0:
                return
            if segment in self._one_offs:
                self._one_offs.discard(segment)
                segment.arena.close()
                return
            self._trim()

    @property
    def in_use(self) -> int:
        """Blocks written and not yet freed."""
        with self._lock:
            return len(self._blocks)

    def close(self) -> None:
        with self._lock:
            for segment in (*self._segments, *self._one_offs):
                segment.arena.close()
            self._segments.clear()
            self._one_offs.clear()
            self._blocks.clear()


class Attachments:
    """The reader's side of ``Blocks``: the peer's segments, attached as they show up. Tensors are read
    as copies, so a segment the peer retired can be let go of; the newest few stay attached, except an
    oversized one (one message's), let go of at once."""

    KEEP = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arenas: dict[str, Arena] = {}

    def read(self, ref: BlockRef, descriptors: list[Descriptor]) -> dict[str, np.ndarray]:
        _, path, size = ref
        if size > KEEP_BYTES:
            single = Arena.attach(path, size)
            try:
                return {d[0]: single.read(d, copy=True) for d in descriptors}
            finally:
                single.release()
        with self._lock:
            arena = self._arenas.pop(path, None) or Arena.attach(path, size)
            self._arenas[path] = arena  # most recently used last
            tensors = {d[0]: arena.read(d, copy=True) for d in descriptors}
            while len(self._arenas) > self.KEEP:
                self._arenas.pop(next(iter(self._arenas))).close()
        return tensors

    def close(self) -> None:
        with self._lock:
            for arena in self._arenas.values():
                arena.close()
            self._arenas.clear()


def carry(blocks: Blocks, tensors: list[tuple[str, np.ndarray]]) -> tuple[BlockRef | None, list[Descriptor]]:
    """One message's tensors as it carries them, outside a batch (a streamed response, a BLS call and its
    answers): in the message itself when small (``inline``: no block to write, read, and give back with a
    ``Free`` message), else in a block of ``blocks``. (None, []) when there are none."""
    if not tensors:
        return None, []
    carried = inline([tensors])
    if carried is not None:
        return None, carried[0]
    return blocks.write(tensors)


def taken(attachments: Attachments, ref: BlockRef | None, descriptors: list[Descriptor]) -> dict[str, np.ndarray]:
    """The tensors ``carry`` put in a message, by name: copied out of the peer's block ``ref`` (the
    receiver then frees it), or read out of the message itself (views of its own bytes). Descriptors
    that do not add up are a ValueError (``read_tensor``)."""
    if ref is not None:
        return attachments.read(ref, descriptors)
    return {d[0]: read_tensor(None, d, copy=False) for d in descriptors}
