"""The gRPC port on the appliance's own HTTP/2 transport: one asyncio server, each connection an
``Http2Connection``, every call served by an admitting handler (``appliance.grpc.admission``): admission,
receive slots, then the service.

Bounds (docs/security.md): ``max_connections`` (``appliance.protocol.connections``: a connection over it
is closed at once),
``max_streams_per_connection`` concurrent calls a connection (SETTINGS_MAX_CONCURRENT_STREAMS), ``idle_timeout``
for the preface and for a connection without calls, keepalive pings on connections with calls open, and
``max_message_bytes`` per message. Stop: GOAWAY to every connection, new calls UNAVAILABLE, calls in
progress until the deadline, then cancelled."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import TypeAlias

import grpc

from appliance.core.errors import ConfigError
from appliance.grpc.access import Gate
from appliance.grpc.admission import AdmittingHandlers, Receivers
from appliance.grpc.grpc_config import GrpcConfig
from appliance.grpc.health import HealthService
from appliance.grpc.http2.connection import Http2Connection
from appliance.grpc.service import InferenceService
from appliance.protocol.connections import ConnectionLimiter
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.drain import finish_by

__all__ = ["Http2Server"]

Handler: TypeAlias = grpc.RpcMethodHandler


def _probe_port(host: str, port: int) -> int:
    """Bind ``host:port`` once, as any listener would: fails if the port is held by anyone (another daemon,
    another program), and picks the free port for port 0 (one port, where ``host`` names several addresses)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot bind gRPC to {host}:{port}: {exc.strerror or exc}; pick another "
                              "--grpc-port, or --no-grpc") from None
        return probe.getsockname()[1]


class Http2Server:
    """``start`` binds and serves, ``stop`` keeps to the daemon's deadline."""

    def __init__(self, config: GrpcConfig, gate: Gate, handler: Callable[[bytes], Handler | None]) -> None:
        """``handler``: the handler of the RPC at a ``:path``, None for an unknown one."""
        self.config = config
        self.gate = gate
        self.handler = handler
        self.loop = asyncio.get_running_loop()
        self._connections: set[Http2Connection] = set()
        self._limiter = ConnectionLimiter(config.max_connections, port="the gRPC port")
        self._listener: asyncio.AbstractServer | None = None
        self.port: int | None = None

    @classmethod
    def over(cls, dataplane: DataPlane, config: GrpcConfig) -> Http2Server:
        """The server of Triton's GRPCInferenceService over ``dataplane``."""
        gate = Gate(dataplane, config.max_streams)
        service = InferenceService(dataplane, gate, config.stream, config.inflation)
        receivers = Receivers(config.receivers, rules=config.receiving)
        handlers = AdmittingHandlers(service, HealthService(dataplane, gate), dataplane, gate, receivers,
                                     config.inflation)
        return cls(config, gate, handlers.by_path)

    def opened(self, connection: Http2Connection) -> None:
        self._connections.add(connection)

    def closed(self, connection: Http2Connection) -> None:
        self._connections.discard(connection)

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a free port), start serving and return the bound port."""
        port = _probe_port(host, port)
        try:
            # With TLS, gRPC's ALPN protocol h2, required (Http2Connection closes a connection whose
            # handshake did not select it); a failed handshake ends that connection alone.
            tls = self.config.tls.context(alpn=("h2",)) if self.config.tls is not None else None
            connection = self._limiter.wrap(lambda: Http2Connection(self))
            self._listener = await self.loop.create_server(connection, host, port, reuse_address=True, backlog=1024,
                                                           ssl=tls, ssl_handshake_timeout=10.0 if tls else None)
        except OSError as exc:
            raise ConfigError(f"cannot bind gRPC to {host}:{port}: {exc.strerror or exc}; pick another "
                              "--grpc-port, or --no-grpc") from None
        self.port = port
        return port

    async def stop(self, deadline: float) -> None:
        """Turn new calls away, let calls in progress finish until ``deadline`` (``time.monotonic()``),
        then cancel what is left."""
        self.gate.stop()
        if self._listener is not None:
            self._listener.close()
        for connection in list(self._connections):
            connection.go_away()
        running: set[asyncio.Future] = set(self.gate.running)  # a stream's requests run in tasks of their own
        for connection in self._connections:
            running.update(connection.running())
        await finish_by(deadline, running, "gRPC request(s)")
        for connection in list(self._connections):
            connection.close()
