"""The HTTP server around an application: a bound on open connections, a bound on the time a connection
may take to send its request head, and a stop that keeps to one deadline.

- **Connections** (``max_connections``, shared by every port of the daemon: the gRPC port takes its share,
  the HTTP and metrics ports count the rest together): ``appliance.protocol.connections`` counts them;
  beyond the bound a new one gets this module's short 503 and is closed at once, never queued behind the
  others and never handed to aiohttp (so it counts against no request limit).
- **Request heads** (``header_timeout``, nginx's client_header_timeout): aiohttp arms its keep-alive
  timer when a connection opens and closes a connection that is still waiting for a complete request
  head when it fires, so its ``keepalive_timeout`` is the header timeout (and bounds idle keep-alive
  connections as well). Bodies have their own timeout in ``appliance.rest.body``.
- **The infer lane** (``appliance.rest.lane``, the ``http_infer_lane`` setting): every connection starts
  on it, and is handed to aiohttp at its first request that is not a small infer request.
- **Stop**: listening stops, idle connections close, requests in progress get until the deadline, the
  rest are cancelled, then the application's cleanup runs (see ``appliance.rest.app`` for its grace).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from appliance.core.errors import ConfigError
from appliance.protocol.connections import ConnectionLimiter
from appliance.protocol.drain import CANCEL_GRACE, finish_by
from appliance.rest.lane import InferLane

__all__ = ["HttpServer", "fit_connections_to_descriptors"]

log = logging.getLogger(__name__)

# File descriptors kept for everything but client connections: models, SQLite, pipes to model
# processes, sockets of refused connections.
_DESCRIPTOR_RESERVE = 256
_HANDSHAKE_TIMEOUT = 10.0
"""Seconds a TLS handshake may take; a client that starts one and stalls holds its connection no longer."""


def fit_connections_to_descriptors(max_connections: int) -> int:
    """Raise this process's soft limit on file descriptors as far as ``max_connections`` needs (up to
    the hard limit) and return the connection bound that fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _DESCRIPTOR_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the file-descriptor limit from %d to %d: %s", soft, target, exc)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fitting = max(1, soft - _DESCRIPTOR_RESERVE)
    log.warning(
        "max_connections is %d but the file-descriptor limit is %d (hard limit %d): serving at most %d "
        "connections; raise the limit (LimitNOFILE= in the unit, ulimit -n) or lower max_connections",
        max_connections, soft, hard, fitting,
    )
    return fitting


class _LimitedSite(web.BaseSite):
    """A TCP site whose connections go through a ``ConnectionLimiter``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limiter: ConnectionLimiter,
                 lane: InferLane | None, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limiter = limiter
        self._lane = lane
        self._tls = tls

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "the runner is set up before its sites start"
        protocol = server if self._lane is None else self._lane.protocol(server)
        # TLS (when set) wraps the socket below the connection cap, the lane and aiohttp: each sees plain
        # HTTP; a handshake that fails (a plaintext request, a refused client certificate) ends that
        # connection alone, inside the header timeout.
        self._server = await asyncio.get_running_loop().create_server(
            self._limiter.wrap(protocol), self._host, self._port, reuse_address=True, ssl=self._tls,
            ssl_handshake_timeout=_HANDSHAKE_TIMEOUT if self._tls is not None else None,
        )


class HttpServer:
    """One application served over TCP with the limits above, as a ``protocol.front_end.FrontEnd``:
    ``start`` starts the application (its cleanup contexts) and binds, ``stop`` keeps to a deadline.
    ``lane``: the infer lane in front of the application (None: aiohttp takes every connection)."""

    def __init__(self, app: web.Application, limiter: ConnectionLimiter, header_timeout: float,
                 lane: InferLane | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._limiter = limiter
        self._lane = lane
        self._tls = tls
        # No access log: it costs more per request than the rest of the HTTP layer. Handler
        # cancellation: a client that disconnects while queued is dropped from its model's queue.
        # No automatic decompression: appliance.rest.body inflates bodies with a bound, off the loop.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                                     keepalive_timeout=header_timeout, auto_decompress=False,
                                     shutdown_timeout=CANCEL_GRACE)

    @property
    def addresses(self) -> list:
        return self._runner.addresses

    @property
    def port(self) -> int | None:
        return self.addresses[0][1] if self._runner.server is not None and self.addresses else None

    async def start(self, host: str, port: int, flag: str = "--http-port") -> int:
        """Bind ``host``:``port``; a port that cannot be bound is one ``ConfigError`` naming ``flag``."""
        await self._runner.setup()
        try:
            await _LimitedSite(self._runner, host, port, self._limiter, self._lane, self._tls).start()
        except OSError as exc:  # the caller's stop() cleans the application up, as after any start
            raise ConfigError(f"cannot bind HTTP to {host}:{port}: {exc.strerror or exc}; pick another {flag} (0 "
                              "picks a free one), or stop what holds the port") from None
        bound = self.port
        assert bound is not None
        return bound

    async def stop(self, deadline: float) -> None:
        """Stop listening, close idle connections, give requests in progress until ``deadline``
        (``time.monotonic()``), cancel what is left, then clean the application up."""
        for site in list(self._runner.sites):
            await site.stop()
        lane = asyncio.ensure_future(self._lane.stop(deadline)) if self._lane is not None else None
        server = self._runner.server
        if server is not None:
            server.pre_shutdown()
            # aiohttp's per-connection shutdown waits its timeout for the request, then as long again
            # after cancelling it: bound it by the deadline instead, then close what is still busy (with
            # handler cancellation, that cancels its handler at once).
            remaining = max(deadline - time.monotonic(), 0.01)
            waits: dict[asyncio.Future[Any], RequestHandler] = {
                asyncio.ensure_future(c.shutdown(remaining)): c for c in server.connections}

            def cut(wait: asyncio.Future[Any]) -> None:
                wait.cancel()
                waits[wait].force_close()

            await finish_by(deadline, waits, cancel=cut)
        if lane is not None:
            await lane
        await self._runner.cleanup()
