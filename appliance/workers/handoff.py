"""Handing a connection from a front-end worker to the daemon: a connection whose request the lane does
not serve (any route but the lane's, an unusual request) is aiohttp's, and aiohttp runs in the daemon.
The worker sends the connection's socket (``SCM_RIGHTS``) with the bytes it has read and not served,
over a UNIX ``SOCK_SEQPACKET`` socket, then closes its own copy; the daemon serves the socket from those
bytes on, as the lane in the daemon hands a connection to aiohttp (``appliance.rest.lane_connection``).

A hand-over is a first message carrying the socket and up to ``_CHUNK`` bytes, then as many messages of
bytes as the rest needs, the last one marked. What a worker has read is bounded by the lane (a head and a
body beyond one read of the socket), and the daemon takes at most ``MAX_PENDING`` bytes for one, and
closes one whose last piece has not come within ``_PARTIAL_TIMEOUT``. A worker sends its hand-overs one
at a time from a thread of their own, so a busy daemon slows hand-overs, never the worker's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import struct
import typing
from collections.abc import Callable

__all__ = ["HandOff", "HandOver", "MAX_PENDING", "Receiver", "handoff_pair"]

log = logging.getLogger(__name__)

_CHUNK = 64 << 10
_MORE = struct.Struct("<?")  # whether more bytes of this connection follow
MAX_PENDING = 4 << 20
_SEND_TIMEOUT = 5.0
_PARTIAL_TIMEOUT = 10.0


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """The two ends of a hand-over socket: (the daemon's, the worker's, inheritable)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


class HandOver:
    """The worker's end: sends a connection's socket and what was read of it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sock.settimeout(_SEND_TIMEOUT)  # the daemon reads these on its loop, as they come
        self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hand-over")

    async def send_off_loop(self, fd: int, pending: bytes) -> None:
        """``send`` on the hand-over thread (one at a time, so that the pieces of two never interleave)."""
        await asyncio.get_running_loop().run_in_executor(self._sender, self.send, fd, pending)

    def send(self, fd: int, pending: bytes) -> None:
        """Send the socket ``fd`` (the caller closes its own copy after) and ``pending``. Raises OSError."""
        first, rest = pending[:_CHUNK], pending[_CHUNK:]
        socket.send_fds(self._sock, [_MORE.pack(bool(rest)) + first], [fd])
        while rest:
            piece, rest = rest[:_CHUNK], rest[_CHUNK:]
            self._sock.sendall(_MORE.pack(bool(rest)) + piece)

    def close(self) -> None:
        self._sender.shutdown(wait=False, cancel_futures=True)
        self._sock.close()


class HandOff(asyncio.Protocol):
    """The protocol a worker's lane hands a connection to (as the daemon's lane hands one to aiohttp): it
    stops reading, collects the bytes the lane hands with it, and on the next turn of the loop sends the
    socket and those bytes to the daemon and lets go of the connection."""

    def __init__(self, over: HandOver) -> None:
        self._over = over
        self._transport: asyncio.Transport | None = None
        self._pending = bytearray()
        self._sending: asyncio.Task | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.Transport, transport)
        self._transport.pause_reading()
        # Sent from the next turn: the lane hands the bytes it has read right after this call.
        self._sending = asyncio.get_running_loop().create_task(self._send())

    def data_received(self, data: bytes) -> None:
        self._pending += data

    def eof_received(self) -> bool:
        return True  # the socket's end of input stays for the daemon to read

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    async def _send(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        sock = transport.get_extra_info("socket")
        try:
            await self._over.send_off_loop(sock.fileno(), bytes(self._pending))
        except (OSError, RuntimeError) as exc:  # RuntimeError: the worker is stopping
            log.warning("cannot hand a connection to the daemon (%s): closing it", exc)
        transport.abort()  # this process's copy; the daemon's serves on


class Receiver:
    """The daemon's end: takes handed connections as they come (``start``, on the event loop) and calls
    ``serve(sock, pending)`` for each one complete."""

    def __init__(self, sock: socket.socket, serve: Callable[[socket.socket, bytes], None]) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._serve = serve
        self._partial: tuple[socket.socket, bytearray] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        self._drop_partial()
        self._sock.close()

    def _drop_partial(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._partial is not None:
            self._partial[0].close()
            self._partial = None

    def _expire(self) -> None:
        self._expiry = None
        if self._partial is not None:
            log.error("a front-end worker's hand-over stalled for %.0f s: the connection is closed", _PARTIAL_TIMEOUT)
            self._drop_partial()

    def _readable(self) -> None:
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, _CHUNK + 1, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("the hand-over socket of a front-end worker failed: %s", exc)
                self.close()
                return
            if not data and not fds:  # the worker is gone
                self.close()
                return
            self._take(data, fds, flags)

    def _take(self, data: bytes, fds: list[int], flags: int) -> None:
        if flags & socket.MSG_CTRUNC or len(fds) > 1 or not data:
            for fd in fds:
                os.close(fd)
            log.error("a front-end worker handed over a malformed connection: dropped")
            return
        (more,) = _MORE.unpack_from(data)
        if fds:
            self._drop_partial()  # (a previous one that never finished)
            try:
                handed = socket.socket(fileno=fds[0])
            except OSError:  # not a socket
                os.close(fds[0])
                log.error("a front-end worker handed over a descriptor that is no socket: dropped")
                return
            self._partial = (handed, bytearray())
            if self._loop is not None:
                self._expiry = self._loop.call_later(_PARTIAL_TIMEOUT, self._expire)
        if self._partial is None:
            log.error("a front-end worker sent bytes of no connection: dropped")
            return
        sock, pending = self._partial
        pending += data[1:]
        if len(pending) > MAX_PENDING:
            log.error("a front-end worker handed over more than %d bytes with a connection: closed", MAX_PENDING)
            self._drop_partial()
            return
        if not more:
            self._partial = None
            if self._expiry is not None:
                self._expiry.cancel()
                self._expiry = None
            self._serve(sock, bytes(pending))
