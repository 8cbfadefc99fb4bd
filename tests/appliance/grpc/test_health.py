"""grpc.health.v1.Health below the transport: the server's status follows its readiness, an open Watch
reports each change and ends with NOT_SERVING when the server stops; the messages are health.proto's."""

from __future__ import annotations

import asyncio

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.grpc.access import Gate
from appliance.grpc.health import (
    NOT_SERVING,
    SERVING,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthService,
)
from tests.waiting import await_until


class _DataPlane:
    """What the health service reads of the data plane: the server's and the models' readiness."""

    def __init__(self) -> None:
        self.server_ready = False
        self.models: set[str] = set()

    def ready(self) -> bool:
        return self.server_ready

    def model_ready(self, name: str) -> bool:
        return name in self.models

    def check_access(self, operation, caller) -> None:
        pass


class _Context:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def write(self, message) -> None:
        self.sent.append(message.status)


def test_the_messages_are_health_protos():
    assert HealthCheckRequest(service="m").SerializeToString() == b"\x0a\x01m"
    assert HealthCheckResponse(status=SERVING).SerializeToString() == b"\x08\x01"
    assert HealthCheckResponse.FromString(b"\x08\x02").status == NOT_SERVING


async def test_check_follows_the_servers_readiness():
    dataplane = _DataPlane()
    health = HealthService(dataplane, Gate(dataplane))  # type: ignore[arg-type]
    assert (await health.Check(HealthCheckRequest(), _Context())).status == NOT_SERVING  # still loading
    dataplane.server_ready = True
    assert (await health.Check(HealthCheckRequest(), _Context())).status == SERVING


async def test_watch_reports_each_change_and_ends_not_serving_when_the_server_stops():
    dataplane = _DataPlane()
    gate = Gate(dataplane)  # type: ignore[arg-type]
    health, context = HealthService(dataplane, gate), _Context()  # type: ignore[arg-type]
    watching = asyncio.create_task(health.Watch(HealthCheckRequest(service="m"), context))
    await await_until(lambda: context.sent == [NOT_SERVING], timeout=5, what="the first status")
    dataplane.models.add("m")
    await await_until(lambda: context.sent == [NOT_SERVING, SERVING], timeout=5, what="the change")
    gate.stop()
    await asyncio.wait_for(watching, 5)  # ends at once, not at its next look
    assert context.sent == [NOT_SERVING, SERVING, NOT_SERVING]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=512))
async def test_any_request_bytes_are_a_status_or_a_decode_error(raw):
    """Hostile bytes as a Check request: protobuf refuses them (the transport answers INVALID_ARGUMENT, as
    test_health_e2e checks), or they name a service, which gets SERVING or NOT_SERVING: nothing else."""
    dataplane = _DataPlane()
    dataplane.server_ready = True
    health = HealthService(dataplane, Gate(dataplane))  # type: ignore[arg-type]
    try:
        request = HealthCheckRequest.FromString(raw)
    except DecodeError:
        return
    answer = await health.Check(request, _Context())
    assert answer.status == (SERVING if request.service == "" else NOT_SERVING)
