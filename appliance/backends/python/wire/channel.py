"""The channel between the daemon and a model process: two pipes, one each way.

Each message is a length-prefixed frame (multiprocessing's ``Connection`` framing: a 4-byte big-endian
length, or -1 and an 8-byte one from 2 GiB up), written in one ``write`` up to 16 KiB. The framing is
the channel's own rather than ``multiprocessing.connection``'s: a read takes what the pipe holds (at most
64 KiB), and the frames in it are split off there, so a small frame costs one read, not two, and frames
that came together cost one; a model process does not load multiprocessing (1.3 MiB each).

Pipes rather than a socket pair: a pipe's write is cheaper than a Unix socket's (no socket buffer per
message) and its read wakes a writer only when the pipe was full, so on this project's VMs a
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
import struct

__all__ = ["CAPACITY", "Channel"]

CAPACITY = 256 * 1024
"""Bytes a pipe holds before its writer waits (a socket pair's default buffer is ~208 KiB)."""
_SIZE = struct.Struct("!i")
_LARGE_SIZE = struct.Struct("!Q")
_READ_BYTES = 64 * 1024
"""Bytes one read takes at most (a larger frame comes in several)."""
_JOINED = 16 * 1024
"""Frames up to this size go out in one write with their header (larger ones: two, without a copy)."""


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default 64 KiB stays
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, CAPACITY)
    return read, write


class Channel:
    """One end: frames in from one pipe, out through the other. Sending and receiving may happen on
    different threads; each direction on one thread at a time (the callers hold their own locks)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = read_fd
        self._out = write_fd
        self._closed = False
        self._held = bytearray()
        """Non-blocking reading (``fill``): what has been read and not yet taken as frames."""
        self._taken = 0
        """Where in ``_held`` the next frame starts."""
        self._inbox = bytearray(_READ_BYTES)
        """What one read fills: the same buffer each time (``os.read`` of this size would map and unmap a
        fresh one per call, past malloc's mmap threshold: three system calls more a read)."""

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
        size = len(data)
        if size <= _JOINED:
            self._write(_SIZE.pack(size) + data)
            return
        self._write(_SIZE.pack(size) if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _LARGE_SIZE.pack(size))
        self._write(data)

    def _write(self, data: bytes) -> None:
        written = os.write(self._out, data)
        if written < len(data):  # a large frame, or a signal: the rest
            view = memoryview(data)
            while written < len(view):
                written += os.write(self._out, view[written:])

    def recv_bytes(self) -> bytes:
        """The next frame (blocks until it is whole); EOFError once the other end is gone. Reads what the
        pipe holds, at most _READ_BYTES at a time (``fill``): a small frame takes one read, and frames that
        came together are taken from what was read (``holds_frame`` says so before waiting on the pipe)."""
        frame = self.next_frame()
        while frame is None:
            read = self.fill()
            if read is False:
                if self._taken < len(self._held):
                    raise OSError(f"the channel ended within a message ({len(self._held) - self._taken} bytes of "
                                  "it came)")
                raise EOFError("the other end closed the channel")
            frame = read if type(read) is bytes else self.next_frame()
        return frame

    def read_without_waiting(self) -> None:
        """From now on frames are taken with ``fill`` and ``next_frame`` (the event loop reads), not
        ``recv_bytes``, which would wait for nothing."""
        os.set_blocking(self._in, False)

    def fill(self) -> bytes | bool:
        """Read what the pipe holds now, at most _READ_BYTES (one system call a wake-up however many frames
        came, where a frame read by itself took two and a poll to learn of the next), waiting for it unless
        reading without waiting. A read that is exactly one whole frame with nothing held before it (the
        common read: one reply, one command) is that frame, taken; else True, the frames read (if any)
        waiting for ``next_frame``, or False once the other end has closed. What a frame's header claims is
        held only as its bytes arrive."""
        try:
            count = os.readv(self._in, (self._inbox,))
        except BlockingIOError:  # woken for nothing
            return True
        if not count:
            return False
        inbox = self._inbox
        whole = self._taken == len(self._held)  # all taken: start again rather than grow
        if whole and count > 4 and _SIZE.unpack_from(inbox)[0] == count - 4:
            return bytes(memoryview(inbox)[4:count])  # (one copy: a bytearray's slice would be another)
        chunk = memoryview(inbox)[:count]
        if whole:
            self._held = bytearray(chunk)
            self._taken = 0
        else:
            self._held += chunk
        return True

    def next_frame(self) -> bytes | None:
        """The next whole frame ``fill`` has read, or None until more arrives."""
        bounds = self._frame_bounds()
        if bounds is None:
            return None
        start, end = bounds
        held = self._held
        self._taken = end
        if end > _READ_BYTES:  # let go of what was taken (a frame larger than one read came in pieces)
            frame = bytes(held[start:end])
            del held[:end]
            self._taken = 0
            return frame
        return bytes(held[start:end])

    @property
    def all_taken(self) -> bool:
        """Whether every byte read has been given out in frames (nothing of a next frame is in yet)."""
        return self._taken == len(self._held)

    @property
    def holds_frame(self) -> bool:
        """Whether ``next_frame`` has a whole frame to give without reading."""
        return self._frame_bounds() is not None

    def _frame_bounds(self) -> tuple[int, int] | None:
        """Where the next frame's bytes start and end in what was read, once all of them are in."""
        held, start = self._held, self._taken
        if len(held) - start < 4:
            return None
        (size,) = _SIZE.unpack_from(held, start)
        start += 4
        if size == -1:
            if len(held) - start < 8:
                return None
            (size,) = _LARGE_SIZE.unpack_from(held, start)
            start += 8
        return (start, start + size) if len(held) - start >= size else None

    def fileno(self) -> int:
        """The descriptor to wait on for the next frame."""
        return self._in

    def fds(self) -> tuple[int, int]:
        """Both descriptors: the one frames come in on, the one they go out on."""
        return self._in, self._out

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._in)
            os.close(self._out)

    def __del__(self) -> None:  # as multiprocessing's Connection: a channel dropped unclosed frees its pipes
        with contextlib.suppress(OSError, AttributeError):
            self.close()
