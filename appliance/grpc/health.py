"""The standard gRPC health service, ``grpc.health.v1.Health``, on the gRPC port (as Triton serves it):
what Kubernetes' gRPC probes and load balancers ask.

``Check`` answers SERVING for the server (``service`` empty) when it is ready, and for a model name when
that model is ready; NOT_SERVING otherwise. ``Watch`` sends the status at once, then each change of it
(looked at every ``WATCH_INTERVAL`` seconds), and NOT_SERVING when the server stops, which ends the call.
Both are admitted as ServerReady (no token, like ``/v2/health/ready``, and counted in
max_concurrent_requests: a Watch holds one request for as long as it is open); asking about a model
needs what ModelReady needs.

The two messages are those of grpc's ``health.proto``, built here from their descriptor (grpcio's
``grpcio-health-checking`` package is not a dependency); the bytes are protobuf's, as every other
message the transport carries.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from appliance.grpc.access import Gate, caller_of
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation

__all__ = ["NOT_SERVING", "SERVICE", "SERVING", "WATCH_INTERVAL", "HealthCheckRequest", "HealthCheckResponse",
           "HealthService"]

SERVICE = "grpc.health.v1.Health"
WATCH_INTERVAL = 1.0
"""Seconds between two looks at the status an open Watch reports."""
SERVING, NOT_SERVING = 1, 2
"""``HealthCheckResponse.ServingStatus`` values (UNKNOWN is 0, SERVICE_UNKNOWN 3: never answered here)."""


def _health_messages() -> tuple[Any, Any]:
    """HealthCheckRequest and HealthCheckResponse, from grpc's health.proto (package grpc.health.v1), in a
    pool of their own (no clash with another copy of health.proto in the default pool)."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto", package="grpc.health.v1",
                                               syntax="proto3")
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", 0), ("SERVING", SERVING), ("NOT_SERVING", NOT_SERVING), ("SERVICE_UNKNOWN", 3)):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=field.TYPE_ENUM, label=field.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
                 for name in ("HealthCheckRequest", "HealthCheckResponse"))


HealthCheckRequest, HealthCheckResponse = _health_messages()


class HealthService:
    """``Check`` and ``Watch`` over the data plane's readiness; ``gate`` says when the server stops."""

    def __init__(self, dataplane: DataPlane, gate: Gate) -> None:
        self._dataplane = dataplane
        self._gate = gate

    def _status(self, service: str) -> int:
        if self._gate.stopping:
            return NOT_SERVING
        ready = self._dataplane.model_ready(service) if service else self._dataplane.ready()
        return SERVING if ready else NOT_SERVING

    def _check_access(self, request: Any, context: Any) -> None:
        """A model's readiness is what ModelReady tells: the same access (the server's is open)."""
        if request.service:
            self._dataplane.check_access(Operation.MODEL_READY, caller_of(context))

    async def Check(self, request: Any, context: Any) -> Any:
        self._check_access(request, context)
        return HealthCheckResponse(status=self._status(request.service))

    async def Watch(self, request: Any, context: Any) -> None:
        self._check_access(request, context)
        stopping = asyncio.ensure_future(self._gate.wait_stopping())
        try:
            sent = None
            while True:
                status = self._status(request.service)
                if status != sent:
                    await context.write(HealthCheckResponse(status=status))
                    sent = status
                if stopping.done():
                    return  # NOT_SERVING was the last word: the server stops
                await asyncio.wait((stopping,), timeout=WATCH_INTERVAL)
        finally:
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
