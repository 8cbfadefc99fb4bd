"""One daemon per state directory: an exclusive lock on ``<state_dir>/daemon.lock`` for the daemon's life.

Two daemons on one state directory (both default to ``~/.local/share/appliance``) would interleave
``database is locked`` errors in the metrics history, lose its rows and race on the model cache. The
second one stops at start with one line naming the first one's PID. ``flock`` is released by the kernel
when the holder dies, so a crashed daemon never leaves a stale lock behind; the PID in the file is only
there to name the holder.

A child the daemon is starting holds a copy of the lock's descriptor from its fork until its exec closes it
(close-on-exec). A daemon that stops while one of its threads is starting a child leaves the lock held for
that moment, so a refused start tries again for ``GRACE_SECONDS`` before it names the holder.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from appliance.core.errors import ConfigError

__all__ = ["GRACE_SECONDS", "LOCK_NAME", "StateLock"]

LOCK_NAME = "daemon.lock"
GRACE_SECONDS = 1.0
"""How long a start waits for a lock held only by a stopped daemon's child between fork and exec."""
_RETRY_SECONDS = 0.02
_MAX_PID_BYTES = 32


class StateLock:
    """Held from ``acquire`` until ``release``; its file descriptor is close-on-exec (model processes
    and other children never inherit it, so a lingering child cannot keep the directory locked)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, state_dir: Path) -> StateLock | None:
        """Lock ``state_dir`` (blocking: a file operation, and up to ``GRACE_SECONDS`` when it is held).
        ``None`` when the directory cannot hold a lock file (a read-only state dir: the daemon then writes
        nothing there, so there is nothing to guard). Raises ``ConfigError`` naming the holder's PID when
        another daemon holds it."""
        path = state_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        try:
            _lock(fd)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise ConfigError(
                f"another appliance daemon{f' (PID {holder})' if holder else ''} is serving from the state dir "
                f"{state_dir}: stop it first, or give this daemon its own --state-dir (APPLIANCE_STATE_DIR)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the lock holds without the PID; only the second daemon's message is poorer
        return cls(fd, path)

    def release(self) -> None:
        """Let another daemon take the directory (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor of the open file releases the flock


def _lock(fd: int) -> None:
    """Take the flock, trying again until ``GRACE_SECONDS`` have passed; BlockingIOError when it is still
    held then."""
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(_RETRY_SECONDS)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _MAX_PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
