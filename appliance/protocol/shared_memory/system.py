"""System shared memory: POSIX shared-memory objects (``/dev/shm/<key>``) that clients on this host
create (``tritonclient.utils.shared_memory``) and register by name.

The object is held open, not mapped: tensors are copied in and out with ``pread``/``pwrite`` at the
registered offset. A mapping would let a client that shrinks its object after registering (a plain
``ftruncate``) kill the daemon with SIGBUS on the next access; a short read is an error instead. It
is the same single copy a mapping would need to hand the model an array of its own.

Keys are checked before anything is opened: a plain object name (one optional leading '/', then
letters, digits, '.', '_', '-'; never '..'), never one of the appliance's own arenas, opened without
following links and only if it is a regular file. Errors are Triton's words, which quote the key (escaped and
cut to 80 characters), then what to do.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from appliance.backends.python.wire.arena import ARENA_PREFIX
from appliance.core.errors import InferenceFailed, InvalidInput
from appliance.protocol.shared_memory.table import RegionKind, RegionTable, check_region_name, check_register_integer

__all__ = ["RESERVED_PREFIXES", "SHM_DIR", "TRITON_PREFIX", "SystemRegion", "SystemSharedMemory", "object_name",
           "shown"]

SHM_DIR = Path("/dev/shm")
# Objects the appliance (the Python backend's tensor arenas) and POSIX semaphores keep in /dev/shm.
RESERVED_PREFIXES = (ARENA_PREFIX, "sem.")
# Triton's own Python-backend pools: refused in Triton's words (kTritonSharedMemoryRegionPrefix).
TRITON_PREFIX = "triton_python_backend_shm_region_"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


def shown(key: object, width: int = 80) -> str:
    """A client's key as a message quotes it: non-printable characters escaped, cut to ``width``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(key)[:width + 1])
    return text if len(text) <= width else text[:width] + "..."


def object_name(key: object, region: str) -> str:
    """The object's file name in /dev/shm for a client's key ('/input0' -> 'input0')."""
    if isinstance(key, str) and key.lstrip("/").startswith(TRITON_PREFIX):  # Triton's words
        raise InvalidInput(f"cannot register shared memory region '{region}' with key '{shown(key)}' as the key "
                           f"contains the reserved prefix '{TRITON_PREFIX}'")
    name = key[1:] if isinstance(key, str) and key.startswith("/") else key
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidInput(
            f"cannot register shared memory region '{region}' - invalid shm key '{shown(key)}': the key must be a "
            "plain shared memory object name: an optional leading '/', then up to 255 letters, digits, '.', '_' or "
            "'-' (e.g. '/input0')"
        )
    if name.startswith(RESERVED_PREFIXES):
        prefix = next(p for p in RESERVED_PREFIXES if name.startswith(p))
        raise InvalidInput(
            f"cannot register shared memory region '{region}' with key '{shown(key)}' as the key contains the "
            f"reserved prefix '{prefix}'; the appliance keeps these objects for itself: choose another key"
        )
    return name


class SystemRegion:
    kind = "system"

    def __init__(self, fd: int, key: str, offset: int, byte_size: int) -> None:
        self._fd, self.key, self.offset, self.byte_size = fd, key, offset, byte_size
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: Path, name: str, key: str, offset: int, byte_size: int, region: str) -> SystemRegion:
        try:
            fd = os.open(directory / name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInput(f"Unable to open shared memory region: '{shown(key)}'; {_open_error(exc)}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(
                    f"Invalid shared memory region: '{shown(key)}'; the key does not name a shared memory object (a "
                    "regular file in /dev/shm)"
                )
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"failed to register shared memory region '{region}': invalid args: offset {offset} + byte_size "
                    f"{byte_size} is beyond the end of the shared memory object ({info.st_size} bytes)"
                )
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, key, offset, byte_size)

    def read(self, offset: int, out: memoryview) -> None:
        start, done = self.offset + offset, 0
        while done < len(out):
            try:
                count = os.preadv(self._fd, [out[done:]], start + done)
            except OSError as exc:
                raise InferenceFailed(f"reading shared memory failed: {exc.strerror}") from None
            if count == 0:
                raise self._shrunk()
            done += count

    def write(self, offset: int, data: memoryview) -> None:
        start, done = self.offset + offset, 0
        # Written past its end, the object would silently grow: a client that shrank it gets an error.
        if os.fstat(self._fd).st_size < start + len(data):
            raise self._shrunk()
        while done < len(data):
            try:
                done += os.pwrite(self._fd, data[done:], start + done)
            except OSError as exc:
                hint = " (/dev/shm is full)" if exc.errno == errno.ENOSPC else ""
                raise InferenceFailed(f"writing to shared memory failed: {exc.strerror}{hint}") from None

    @staticmethod
    def _shrunk() -> InvalidInput:
        return InvalidInput(
            "the shared memory object is now smaller than the region registered over it; keep the object's "
            "size while the region is registered, or unregister and register it again"
        )

    def status(self) -> dict[str, Any]:
        return {"key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _open_error(exc: OSError) -> str:
    """What went wrong opening the object, and how to fix it (after Triton's words)."""
    if exc.errno == errno.ENOENT:
        return "no shared memory object with that key exists; create it (shm_open) before registering"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ("the appliance may not read and write that shared memory object; create it with permissions that "
                "let the appliance's user open it")
    if exc.errno == errno.ELOOP:
        return "the key names a symbolic link, not a shared memory object"
    return f"unable to open the shared memory object ({exc.strerror})"


class SystemSharedMemory(RegionKind):
    """The system shared-memory API (Triton's systemsharedmemory extension). ``local``: whether the client
    is on this host, as the front end sees it (see ``LocalPeers``)."""

    kind = "system"

    def __init__(self, table: RegionTable, directory: Path = SHM_DIR) -> None:
        super().__init__(table)
        self._directory = directory

    @property
    def enabled(self) -> bool:
        return self._table.enabled

    def register(self, name: str, key: str, offset: int, byte_size: int, *, local: bool) -> None:
        self._table.check_client(local)
        name = check_region_name(name)
        file_name = object_name(key, name)
        try:  # a missing object first, as Triton checks (SystemRegion.open checks again, holding it)
            os.stat(self._directory / file_name, follow_symlinks=False)
        except OSError as exc:
            raise InvalidInput(f"Unable to open shared memory region: '{shown(key)}'; {_open_error(exc)}") from None
        offset = check_register_integer(offset, "offset", name, 0)
        byte_size = check_register_integer(byte_size, "byte_size", name, 1)
        self._table.add(name, byte_size, lambda: SystemRegion.open(
            self._directory, file_name, key, offset, byte_size, name))
