"""The link between the daemon and one front-end worker: messages (tuples of plain values, pickled) over a
UNIX stream socket, each framed by its length (4 bytes, little-endian). A message sent is written with
every other one sent in the same turn of the event loop (one write for a burst of answers or requests).

Each end bounds what it takes: a frame longer than ``max_frame`` ends the link (the daemon takes a
worker's requests, whose heads and bodies the lane bounds; a worker takes the daemon's answers, which are
not bounded, as over HTTP). A frame is read as its bytes arrive: a length alone allocates nothing. A
frame is unpickled with no class or function allowed (a worker parses hostile bytes; a message is plain
values), and one that does not unpickle ends the link."""

from __future__ import annotations

import asyncio
import io
import logging
import pickle
import struct
import typing
from collections.abc import Callable

__all__ = ["Link", "plain_values"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
MAX_FRAME = (1 << 32) - 1


class _PlainValues(pickle.Unpickler):
    """Unpickles tuples, lists, bytes, strings, numbers, booleans and None; any class or function is refused."""

    def find_class(self, module: str, name: str) -> typing.Any:
        raise pickle.UnpicklingError(f"a link message names {module}.{name}: only plain values travel")


def plain_values(payload: bytes | bytearray) -> typing.Any:
    return _PlainValues(io.BytesIO(payload)).load()


class Link(asyncio.Protocol):
    """One end of a link: ``send`` queues a message, ``on_message`` is called with each one received,
    ``closed`` is done once the link is gone (either end closed it, or a frame broke a rule)."""

    def __init__(self, on_message: Callable[[tuple], None], max_frame: int = MAX_FRAME) -> None:
        self._on_message = on_message
        self._max_frame = min(max_frame, MAX_FRAME)
        self._transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, message: tuple) -> None:
        if self._transport is None:
            return  # the other end is gone: what it would have answered, nobody waits for
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._outgoing.append(_LENGTH.pack(len(payload)))
        self._outgoing.append(payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, []
        if self._transport is not None and outgoing:
            self._transport.writelines(outgoing)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        received = self._received
        received += data
        start, end = 0, len(received)
        try:
            while end - start >= 4:
                (length,) = _LENGTH.unpack_from(received, start)
                if length > self._max_frame:
                    log.error("a front-end link sent a frame of %d bytes (at most %d): closing it", length,
                              self._max_frame)
                    self._abort()
                    return
                if end - start - 4 < length:
                    break
                try:
                    message = plain_values(received[start + 4:start + 4 + length])
                except Exception as exc:  # noqa: BLE001 - whatever a malformed pickle raises
                    log.error("a front-end link sent a frame that is no message (%s): closing it", exc)
                    self._abort()
                    return
                start += 4 + length
                self._on_message(message)
        finally:
            if start:
                del received[:start]

    def _abort(self) -> None:
        self._received.clear()
        if self._transport is not None:
            self._transport.abort()
