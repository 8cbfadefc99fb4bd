"""What the gRPC front end is configured with, free of grpc: built by ``appliance.composition`` from
the settings' ``grpc`` and ``limits`` sections."""

from __future__ import annotations

import dataclasses

from appliance.protocol.inflate import DEFAULT_RATIO, InflateLimits
from appliance.tls.context import ServerTls

__all__ = ["GrpcConfig", "KEEPALIVE", "KEEPALIVE_TIMEOUT", "ReceiveRules", "StreamRules"]

KEEPALIVE = 60.0
"""Seconds a connection with calls open may stay silent before the server pings it."""
KEEPALIVE_TIMEOUT = 20.0
"""Seconds the client has to answer that ping before its connection is dropped."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReceiveRules:
    """How long a call's message may take to arrive once the server reads it."""

    timeout: float = 60.0
    """Seconds for the whole message (body_timeout)."""
    min_rate: float = 256 * 1024
    """Bytes a second it must keep arriving at (grpc_receive_min_rate)..."""
    grace: float = 2.0
    """... once this many seconds have passed (grpc_receive_grace)."""

    def deadline(self, started: float, received: int) -> float:
        """When a message whose reading began at ``started`` and of which ``received`` bytes came falls
        behind the minimum rate (or its whole time is up)."""
        return min(started + self.timeout, started + self.grace + received / self.min_rate)


@dataclasses.dataclass(frozen=True, slots=True)
class StreamRules:
    max_pending: int = 64
    """Requests of one stream read and not yet answered; reading pauses at it."""
    idle_timeout: float = 300.0
    """Seconds a stream with nothing in flight may stay silent before it is ended."""


@dataclasses.dataclass(frozen=True, slots=True)
class GrpcConfig:
    """What the gRPC front end is configured with: built by ``appliance.composition.compose`` from the
    settings' ``grpc`` and ``limits`` sections."""

    max_message_bytes: int = 256 * 1024**2
    receivers: int = 4
    """Messages larger than a stream's window received at once (what the transport buffers before a handler
    can count it)."""
    receive_timeout: float = 60.0
    """Seconds a call's message may take to arrive once its turn to be received has come."""
    receive_min_rate: int = 256 * 1024
    """Bytes a second a message must keep arriving at once read, after ``receive_grace`` seconds."""
    receive_grace: float = 2.0
    max_inflation_ratio: int = DEFAULT_RATIO
    max_connections: int = 1024
    max_streams: int = 1024
    """ModelStreamInfer streams open at once."""
    max_streams_per_connection: int = 1024
    idle_timeout: float = 60.0
    stream: StreamRules = StreamRules()
    tls: ServerTls | None = None
    """TLS on the gRPC port (grpc_use_ssl), None: plain HTTP/2."""

    @property
    def receiving(self) -> ReceiveRules:
        return ReceiveRules(self.receive_timeout, self.receive_min_rate, self.receive_grace)

    @property
    def inflation(self) -> InflateLimits:
        return InflateLimits(self.max_message_bytes, self.max_inflation_ratio)
