"""Every gRPC call counts in max_concurrent_requests (security round 4, medium), ServerLive and ServerReady
included: each costs a stream, a task and a handler, and a flood of them was not
bounded. HTTP's health checks stay outside the bound, so a busy box still answers its monitors."""

from __future__ import annotations

import contextlib

import grpc
import pytest

from tests.h2_client import H2Grpc
from tests.http_util import call
from tests.waiting import wait_until

LIMIT = 4
FLOOD = 32
LIVE = "/inference.GRPCInferenceService/ServerLive"
READY = "/inference.GRPCInferenceService/ServerReady"
METADATA = "/inference.GRPCInferenceService/ServerMetadata"


@pytest.fixture(scope="module")
def daemon(module_daemon):
    return module_daemon(None, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": str(LIMIT),
                                    "APPLIANCE_GRPC_RECEIVE_GRACE": "30"})


def _codes(futures) -> list[tuple[str, str]]:
    found = []
    for future in futures:
        try:
            future.result()
            found.append(("OK", ""))
        except grpc.RpcError as error:
            found.append((error.code().name, error.details() or ""))
    return found


def _wait_until(condition, seconds: float, what: str) -> None:
    wait_until(condition, timeout=seconds, what=what, interval=0.05)


def test_health_calls_count_in_max_concurrent_requests(daemon):
    with contextlib.ExitStack() as stack:
        channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}"))
        live, ready, metadata = (channel.unary_unary(path) for path in (LIVE, READY, METADATA))
        live(b"", timeout=5)
        # LIMIT calls admitted and held: their messages never come (within the 30 s grace).
        holders = [stack.enter_context(H2Grpc(daemon.grpc_port)) for _ in range(LIMIT)]
        for holder in holders:
            holder.open(METADATA)

        def full() -> bool:
            try:
                metadata(b"", timeout=5)
            except grpc.RpcError as error:
                return error.code() is grpc.StatusCode.UNAVAILABLE
            return False

        _wait_until(full, 10, "the held calls were never admitted")
        flood = [method.future(b"", timeout=10) for _ in range(FLOOD // 2) for method in (live, ready)]
        codes = _codes(flood)
        assert {code for code, _ in codes} == {"UNAVAILABLE"}, codes[:4]
        # Refused by the cap itself, or (grpc-core) as a stream over SETTINGS_MAX_CONCURRENT_STREAMS, which
        # is max_concurrent_requests too: REFUSED_STREAM (7), which the client reports as UNAVAILABLE.
        assert all("max_concurrent_requests" in details or "error code 7" in details for _, details in codes), \
            sorted(set(codes))
        assert call(daemon.port, "GET", "/v2/health/live", timeout=2)[0] == 200  # HTTP health stays outside
    # The holders went away: health answers again.
    _wait_until(lambda: _live(daemon), 10, "ServerLive did not answer once the held calls ended")


def _live(daemon) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        try:
            channel.unary_unary(LIVE)(b"", timeout=5)
            return True
        except grpc.RpcError:
            return False
