"""The gRPC front end: Triton's GRPCInferenceService served by ``grpc.aio`` in the daemon's event loop,
over the data plane. What it bounds (see docs/security.md):

- Admission: every call is admitted before its message is read (``appliance.grpc.admission``): the
  token from its metadata, max_concurrent_requests, and a receive slot; each open ModelStreamInfer
  stream counts as a request and among ``max_streams``.
- Messages: ``max_message_bytes`` is the largest message received (gRPC answers RESOURCE_EXHAUSTED
  above it, before the message reaches a handler); ``receivers`` messages are received at once, so
  that ``receivers × max_message_bytes`` fits in the memory budget, and a call that holds a receive slot
  past ``receive_grace`` gives it up to a waiting one (``appliance.grpc.receive``); compressed messages
  reach the handler as sent and are inflated on the request's budget (gRPC's own inflating is off);
  answers are not bounded, as over HTTP.
- Connections: ``max_connections`` over all acceptors (the daemon's max_connections is shared between
  the HTTP and gRPC ports: see ``appliance.composition``); at most ``max_streams_per_connection``
  concurrent calls on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a connection has
  ``idle_timeout`` to complete its HTTP/2 handshake and is closed after as long without a call; clients
  that stay silent on an open call are pinged, and dropped when they do not answer.
- Acceptors: several grpc.aio servers share the port (see ``GrpcServer``).
- Stop: new calls (and new requests on open streams) are answered UNAVAILABLE at once, calls in
  progress get until the deadline, then are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time

import grpc

from appliance.core.errors import ConfigError
from appliance.grpc.access import Gate
from appliance.grpc.admission import AdmittingHandlers, Receivers
from appliance.grpc.grpc_config import CANCEL_GRACE, KEEPALIVE, KEEPALIVE_TIMEOUT, GrpcConfig
from appliance.grpc.service import InferenceService
from appliance.protocol.dataplane import DataPlane

__all__ = ["GrpcServer", "admitting_handlers", "probe_port"]

log = logging.getLogger(__name__)


def probe_port(host: str, port: int) -> int:
    """Bind ``host:port`` once without SO_REUSEPORT, as any listener would: fails if the port is held by
    anyone (another daemon, another program), and picks the free port for port 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot bind gRPC to {host}:{port}: {exc.strerror or exc}; pick another "
                              "--grpc-port, or --no-grpc") from None
        return probe.getsockname()[1]


def admitting_handlers(dataplane: DataPlane, config: GrpcConfig, *,
                       grpcio: bool = False) -> tuple[Gate, AdmittingHandlers]:
    """The gate and the admitting handler of every RPC, over one service: what either transport serves
    (``grpcio``: grpc.aio does, else the appliance's own)."""
    gate = Gate(dataplane, config.max_streams)
    service = InferenceService(dataplane, gate, config.stream, config.inflation)
    receivers = Receivers(config.receivers, rules=config.receiving)
    return gate, AdmittingHandlers(service, dataplane, gate, receivers, config.inflation, grpcio=grpcio)


class GrpcServer:
    """``start`` binds and serves, ``stop`` keeps to the daemon's deadline.

    ``acceptors`` grpc.aio servers share the port (SO_REUSEPORT, after the port was checked free): a
    grpc.aio server takes one new call at a time, each through a round trip between gRPC's completion
    queue thread and the event loop, so under concurrent load a single one spends its time accepting.
    The kernel spreads connections over the acceptors; they share one service, gate and data plane."""

    def __init__(self, dataplane: DataPlane, config: GrpcConfig) -> None:
        acceptors = config.acceptors
        if acceptors < 1:
            raise ValueError(f"a gRPC server needs at least one acceptor, got {acceptors}")
        idle_ms = int(config.idle_timeout * 1000)
        options = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if acceptors > 1 else 0),
            ("grpc.server_handshake_timeout_ms", idle_ms),
            ("grpc.max_connection_idle_ms", idle_ms),
            # Counted per acceptor; the kernel spreads connections over them.
            ("grpc.max_allowed_incoming_connections", max(1, math.ceil(config.max_connections / acceptors))),
            ("grpc.max_concurrent_streams", config.max_streams_per_connection),
            # No window beyond what a pending read asks for: with BDP probing gRPC grows its HTTP/2 windows
            # and buffers megabytes per call before any handler has admitted it (measured: 24 unread
            # 16 MiB calls held 390 MiB with it, 3 MiB without).
            ("grpc.http2.bdp_probe", 0),
            # Server pings on connections with calls open: a client that vanished without closing is dropped.
            ("grpc.keepalive_time_ms", int(KEEPALIVE * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT * 1000)),
            # Clients that keep their connection alive with pings (tritonclient's KeepAliveOptions) are
            # welcome to, as under Triton.
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
            # Compressed messages come to the handler as sent: gRPC would inflate each whole, unbounded, on its
            # own threads before any handler could count it (eight 764 KiB gzip messages of zeros took RSS
            # 532 MiB past a 300 MiB budget); the handler inflates them on the request's budget
            # (appliance.protocol.inflate).
            ("grpc.per_message_decompression", 0),
        ]
        self.gate, handlers = admitting_handlers(dataplane, config, grpcio=True)
        self._servers = [grpc.aio.server(options=options) for _ in range(acceptors)]
        for server in self._servers:
            server.add_generic_rpc_handlers([handlers])
        self.port: int | None = None
        self._credentials = None
        if config.tls is not None:
            chain, key, root = config.tls.pem()
            self._credentials = grpc.ssl_server_credentials([(key, chain)], root_certificates=root,
                                                            require_client_auth=config.tls.mutual)

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a free port), start serving and return the bound port."""
        port = probe_port(host, port)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        for server in self._servers:
            try:
                bound = (server.add_insecure_port(address) if self._credentials is None
                         else server.add_secure_port(address, self._credentials))
            except RuntimeError as exc:
                raise ConfigError(
                    f"cannot bind gRPC to {address}: {exc}; pick another --grpc-port, or --no-grpc"
                ) from None
            if bound != port:  # older grpcio reports a failed bind as port 0
                raise ConfigError(f"cannot bind gRPC to {address}: the port was taken meanwhile; pick another "
                                  "--grpc-port, or --no-grpc")
        for server in self._servers:
            await server.start()
        self.port = port
        return port

    async def stop(self, deadline: float) -> None:
        """Turn new calls away, let calls in progress finish until ``deadline`` (``time.monotonic()``),
        then cancel what is left."""
        self.gate.stop()
        # grpc.aio's own stop comes only once the calls in progress are done (or the deadline): until then
        # the gate turns new calls away with UNAVAILABLE, as the appliance's transport does, where a call
        # grpc.aio refuses while stopping would end CANCELLED, which clients do not retry elsewhere.
        late = await self.gate.wait_running(max(0.0, deadline - time.monotonic()))
        grace = max(0.0, deadline - time.monotonic())
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
        await self.gate.cancel_running(CANCEL_GRACE)  # gRPC ended their calls, not always their handlers
        if late:
            log.warning("%d gRPC request(s) still running at the shutdown deadline: cancelled", late)
