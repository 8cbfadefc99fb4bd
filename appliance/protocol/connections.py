"""The connection cap every port of the daemon applies before it reads a byte: each accepted connection is
counted until it closes, and one beyond the cap is handed to the port's refusal (the HTTP ports answer a
short 503, the gRPC port closes it) instead of its server, so it is never queued behind
the others and counts against no request limit.

One ``ConnectionLimiter`` wraps the protocol factory of every listener it bounds (the HTTP and metrics
ports share one, the gRPC port has its own). ``appliance.composition.split_connections`` splits
``max_connections`` between them."""

from __future__ import annotations

import asyncio
import logging
import typing
import weakref
from collections.abc import Callable

__all__ = ["ConnectionLimiter", "ProtocolWrapper", "close_at_once"]

log = logging.getLogger(__name__)


class ConnectionLimiter:
    """Counts open connections over every listener it wraps and turns away those beyond ``limit`` with a
    protocol from ``refuse`` (the port's own refusal; by default ``close_at_once``)."""

    def __init__(self, limit: int, refuse: Callable[[], asyncio.Protocol] | None = None,
                 port: str = "the server") -> None:
        if limit < 1:
            raise ValueError(f"a connection limit must be at least 1, got {limit}")
        self.limit = limit
        self.open = 0
        self.refused = 0
        self._refuse = refuse or close_at_once
        self._port = port

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` in front of ``factory``."""

        def make() -> asyncio.Protocol:
            if self.open >= self.limit:
                self.refused += 1
                log.warning("%s refused a connection: %d are open (max_connections)", self._port, self.open)
                return self._refuse()
            self.open += 1
            return _Counted(factory(), self._release)

        return make

    def _release(self) -> None:
        self.open -= 1


def close_at_once() -> asyncio.Protocol:
    """The refusal of a port that has no words for it (gRPC, as grpc-core's max_allowed_incoming_connections
    does): the connection is aborted as soon as it is made."""
    return _Abort()


class _Abort(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        typing.cast(asyncio.Transport, transport).abort()  # uvloop's transport is no asyncio.Transport


class ProtocolWrapper(asyncio.Protocol):
    """A connection's protocol in front of another (``inner``), passing every event on; subclasses add
    to the events they override."""

    __slots__ = ("_inner",)

    def __init__(self, inner: asyncio.Protocol) -> None:
        self._inner = inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    @property
    def data_received(self) -> Callable[[bytes], None]:
        """The inner protocol's own: the event loop looks it up when the connection is made (uvloop does
        once) and calls it without a step in between (a connection's every read goes through here)."""
        return self._inner.data_received

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _Counted(ProtocolWrapper):
    """The protocol for one connection, unchanged, plus giving back the connection's slot once."""

    __slots__ = ("_done", "__weakref__")

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None]) -> None:
        super().__init__(inner)
        # Released when the connection is lost, or when this object goes away without ever having
        # been connected (asyncio could not make a transport for the accepted socket).
        self._done = weakref.finalize(self, release)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._done()
