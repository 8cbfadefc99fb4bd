"""The HTTP ports' connection cap (``max_connections``, less the gRPC port's share): a connection beyond it
gets a short 503 and is closed, never queued behind the others and never handed to aiohttp or the lane
(so it counts against no request limit). The daemon's HTTP and metrics ports share it."""

from __future__ import annotations

import asyncio
import typing

import orjson

from appliance.protocol.connections import ConnectionLimiter

__all__ = ["http_connection_limiter"]

# A refused connection is answered and closed; its socket lingers this long at most, so the 503 is
# read rather than lost to a reset, and no more than this many linger at once.
_REFUSAL_LINGER = 1.0
_MAX_LINGERING_REFUSALS = 64


def _refusal_response(limit: int) -> bytes:
    body = orjson.dumps({"error": f"the server's HTTP ports have {limit} connections open (max_connections, less the "
                                  "gRPC port's share); retry shortly"})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def http_connection_limiter(limit: int) -> ConnectionLimiter:
    """The limiter of the HTTP and metrics ports: a connection beyond ``limit`` is answered 503."""
    refusals = _Refusals(limit)
    return ConnectionLimiter(limit, lambda: _Refusal(refusals), port="the HTTP ports")


class _Refusals:
    """What the HTTP ports' refused connections share: the answer, and how many linger now."""

    def __init__(self, limit: int) -> None:
        self.answer = _refusal_response(limit)
        self.lingering = 0


class _Refusal(asyncio.Protocol):
    """Answers 503 and closes without reading the request (what was sent is read and dropped for a
    moment so that closing does not reset the connection before the client reads the answer). Over TLS,
    where a transport cannot half-close, the answer is followed by the TLS close at once."""

    def __init__(self, refusals: _Refusals) -> None:
        self._refusals = refusals
        self._lingers = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's is not a subclass of asyncio.Transport, hence no isinstance.
        transport = typing.cast(asyncio.Transport, transport)
        transport.write(self._refusals.answer)
        if self._refusals.lingering >= _MAX_LINGERING_REFUSALS:
            transport.close()
            return
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client is gone already
                transport.close()
                return
            linger_end = transport.close
        else:
            # TLS cannot half-close: close() flushes the answer and sends close_notify, then waits for
            # the client's; that wait lingers as long as a half-close would, no longer.
            transport.close()
            linger_end = transport.abort
        self._refusals.lingering += 1
        self._lingers = True
        self._timer = asyncio.get_running_loop().call_later(_REFUSAL_LINGER, linger_end)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._lingers:
            self._refusals.lingering -= 1
