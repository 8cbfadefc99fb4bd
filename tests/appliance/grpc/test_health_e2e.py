"""The standard gRPC health service (grpc.health.v1.Health) on the gRPC port, through grpcio's own client
with the messages encoded by hand (health.proto: ``service`` is field 1, a string; ``status`` field 1, an
enum): Check answers SERVING for the server and a ready model, NOT_SERVING for a model that is not loaded
or does not exist; Watch sends the status, then its change; the model's status needs the token where
ModelReady does, the server's never."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest
import tritonclient.grpc as triton

from tests.builders import affine_model, write_model
from tests.relay import relay

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"
REMOTE = "127.0.0.2"  # not exempt: needs the token where the access table asks for it


def _request(service: str = "") -> bytes:
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name if name else b""  # names under 128 bytes: a one-byte length


def _raw(message: bytes) -> bytes:
    return message


@pytest.fixture(scope="module")
def daemon(module_daemon, tmp_path_factory):
    repo = tmp_path_factory.mktemp("health") / "repo"
    write_model(repo, "loaded", affine_model(2.0, 1.0))
    write_model(repo, "unloaded", affine_model(3.0, 0.0))
    return module_daemon(repo, "--model-control-mode", "explicit", "--load-model", "loaded",
                         env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32", "APPLIANCE_PROTECT_INFERENCE": "true"})


@pytest.fixture
def channel(daemon):
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        yield channel


def _token(daemon) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {(daemon.log_path.parent / 'auth-token').read_text().strip()}")]


def test_check_answers_serving_for_the_server_and_a_ready_model_only(channel):
    check = channel.unary_unary(CHECK, request_serializer=_raw, response_deserializer=_raw)
    assert check(_request(), timeout=10) == SERVING
    assert check(_request("loaded"), timeout=10) == SERVING
    assert check(_request("unloaded"), timeout=10) == NOT_SERVING
    assert check(_request("no_such_model"), timeout=10) == NOT_SERVING


def test_a_models_status_needs_what_model_ready_needs_and_the_servers_nothing(daemon):
    with relay(daemon.grpc_port, REMOTE) as port, grpc.insecure_channel(f"127.0.0.1:{port}") as remote:
        check = remote.unary_unary(CHECK, request_serializer=_raw, response_deserializer=_raw)
        assert check(_request(), timeout=10) == SERVING  # no token: the server's health is open
        with pytest.raises(grpc.RpcError) as refused:  # protect_inference is on: ModelReady needs the token
            check(_request("loaded"), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert check(_request("loaded"), timeout=10, metadata=_token(daemon)) == SERVING


def test_a_malformed_request_is_invalid_argument(channel):
    check = channel.unary_unary(CHECK, request_serializer=_raw, response_deserializer=_raw)
    with pytest.raises(grpc.RpcError) as refused:
        check(b"\x0a\x05ab", timeout=10)  # a 5-byte string with 2 bytes
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "HealthCheckRequest" in (refused.value.details() or "")


def test_watch_sends_the_status_then_its_change(daemon, channel):
    watch = channel.unary_stream(WATCH, request_serializer=_raw, response_deserializer=_raw)
    call = watch(_request("unloaded"), timeout=60)
    statuses: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            for status in call:
                statuses.put(status)
        except grpc.RpcError as error:  # the cancel below ends the call
            statuses.put(error.code())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert statuses.get(timeout=10) == NOT_SERVING
        with triton.InferenceServerClient(daemon.grpc_url) as client:
            client.load_model("unloaded")
        assert statuses.get(timeout=10) == SERVING
        with triton.InferenceServerClient(daemon.grpc_url) as client:
            client.unload_model("unloaded")
        assert statuses.get(timeout=10) == NOT_SERVING
    finally:
        call.cancel()
        reader.join(10)
    assert statuses.get(timeout=10) is grpc.StatusCode.CANCELLED  # nothing more was sent
