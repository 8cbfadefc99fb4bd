"""The gRPC front end: Triton's GRPCInferenceService served by ``grpc.aio`` in the daemon's event loop,
over a started ``Appliance``.

- Messages: ``max_request_bytes`` is the largest message received (gRPC answers RESOURCE_EXHAUSTED
  above it, before the message reaches a handler); answers are not bounded, as over HTTP.
- Connections: a connection has ``header_timeout`` to complete its HTTP/2 handshake and is closed after
  as long without a call (the HTTP side's idle keep-alive bound). ``max_connections`` counts HTTP
  connections only: gRPC multiplexes calls on few connections and grpc.aio has no connection hook.
- Acceptors: several grpc.aio servers share the port (see ``GrpcServer``).
- Stop: new calls (and new requests on open streams) are answered UNAVAILABLE at once, calls in
  progress get until the deadline, then are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import grpc
from tritonclient.grpc import service_pb2_grpc

from appliance.access import parse_networks
from appliance.composition import Appliance
from appliance.engine.tensor_checks import DecodeLimits
from appliance.errors import ConfigError
from appliance.grpc.access import AccessRules, Gate
from appliance.grpc.service import InferenceService

__all__ = ["GrpcServer", "build_service"]

log = logging.getLogger(__name__)

# What requests still running at the stop deadline get to end once cancelled (as over HTTP).
_CANCEL_GRACE = 0.5
# grpc.aio servers sharing the port (see GrpcServer).
ACCEPTORS = 4


def build_service(appliance: Appliance, gate: Gate) -> InferenceService:
    settings = appliance.settings
    return InferenceService(
        appliance.dataplane,
        appliance.budget,
        DecodeLimits(settings.max_tensor_elements, settings.max_inputs),
        appliance.traces,
        appliance.logs,
        gate,
    )


def _probe_port(host: str, port: int) -> int:
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


class GrpcServer:
    """``start`` binds and serves, ``stop`` keeps to the daemon's deadline.

    ``acceptors`` grpc.aio servers share the port (SO_REUSEPORT, after the port was checked free): a
    grpc.aio server takes one new call at a time, each through a round trip between gRPC's completion
    queue thread and the event loop, so under concurrent load a single one spends its time accepting.
    The kernel spreads connections over the acceptors; they share one service, gate and data plane."""

    def __init__(self, appliance: Appliance, acceptors: int = ACCEPTORS) -> None:
        if acceptors < 1:
            raise ValueError(f"a gRPC server needs at least one acceptor, got {acceptors}")
        settings = appliance.settings
        self.gate = Gate(AccessRules(
            token=appliance.token,
            exempt=parse_networks(settings.auth_exempt_networks),
            protect_inference=settings.protect_inference,
            max_concurrent_requests=settings.max_concurrent_requests,
        ))
        idle_ms = int(settings.header_timeout * 1000)
        options = [
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if acceptors > 1 else 0),
            ("grpc.server_handshake_timeout_ms", idle_ms),
            ("grpc.max_connection_idle_ms", idle_ms),
            # Clients that keep their connection alive with pings (tritonclient's KeepAliveOptions) are
            # welcome to, as under Triton.
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
        ]
        service = build_service(appliance, self.gate)
        self._servers = [grpc.aio.server(options=options) for _ in range(acceptors)]
        for server in self._servers:
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a free port), start serving and return the bound port."""
        port = _probe_port(host, port)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        for server in self._servers:
            try:
                bound = server.add_insecure_port(address)
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
        grace = max(0.0, deadline - time.monotonic())
        stopping = asyncio.gather(*(server.stop(grace) for server in self._servers))
        late = await self.gate.wait_running(grace)
        await stopping
        await self.gate.cancel_running(_CANCEL_GRACE)  # gRPC ended their calls, not always their handlers
        if late:
            log.warning("%d gRPC request(s) still running at the shutdown deadline: cancelled", late)
