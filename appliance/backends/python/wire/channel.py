"""The channel between the daemon and a model process: two pipes, one each way.

Each message is a length-prefixed frame (multiprocessing's ``Connection`` framing), written in one
``write``. Pipes rather than a socket pair: a pipe's write is cheaper than a Unix socket's (no socket
buffer per message) and its read wakes a writer only when the pipe was full, so on this project's VMs a
round trip costs ~8–15 µs less CPU on each side (measured with a bare ping-pong, docs/performance.md).
Each pipe holds ``CAPACITY`` bytes (as much as a socket pair's default buffer, where the kernel allows:
past ``/proc/sys/fs/pipe-user-pages-soft``, 64 MiB a user by default, i.e. ~128 model processes, new pipes
keep the kernel's smaller size, which only means a large message is written in more steps): messages are
small, tensors travel through shared memory.

The model process receives its ends as ``READ_FD,WRITE_FD`` on its command line (``argument``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from multiprocessing.connection import Connection

__all__ = ["CAPACITY", "Channel"]

CAPACITY = 256 * 1024
"""Bytes a pipe holds before its writer waits (a socket pair's default buffer is ~208 KiB)."""


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default 64 KiB stays
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, CAPACITY)
    return read, write


class Channel:
    """One end: frames in from one pipe, out through the other. Sending and receiving may happen on
    different threads; each direction on one thread at a time (the callers hold their own locks)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = Connection(read_fd, writable=False)
        self._out = Connection(write_fd, readable=False)

    @classmethod
    def pair(cls) -> tuple[Channel, tuple[int, int]]:
        """The daemon's end, and the two descriptors of the model process's end (to pass it, then close
        here with ``close_fds``)."""
        to_child_read, to_child_write = _pipe()
        to_daemon_read, to_daemon_write = _pipe()
        return cls(to_daemon_read, to_child_write), (to_child_read, to_daemon_write)

    @staticmethod
    def argument(fds: tuple[int, int]) -> str:
        """How the model process's end is named on its command line."""
        return f"{fds[0]},{fds[1]}"

    @classmethod
    def from_argument(cls, text: str) -> Channel:
        read_fd, write_fd = (int(part) for part in text.split(","))
        return cls(read_fd, write_fd)

    @staticmethod
    def close_fds(fds: tuple[int, int]) -> None:
        for fd in fds:
            os.close(fd)

    def send_bytes(self, data: bytes) -> None:
        """One frame (blocks while the pipe is full); OSError once the other end is gone."""
        self._out.send_bytes(data)

    def recv_bytes(self) -> bytes:
        """The next frame (blocks until it is whole); EOFError once the other end is gone."""
        return self._in.recv_bytes()

    def fileno(self) -> int:
        """The descriptor to wait on for the next frame."""
        return self._in.fileno()

    def fds(self) -> tuple[int, int]:
        """Both descriptors: the one frames come in on, the one they go out on."""
        return self._in.fileno(), self._out.fileno()

    @property
    def closed(self) -> bool:
        return self._in.closed

    def close(self) -> None:
        self._in.close()
        self._out.close()
