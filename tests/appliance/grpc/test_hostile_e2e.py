"""Hostile clients of the gRPC port: memory bombs that must be refused before their bytes are held,
streams that pile requests up, idle streams and connection floods. All the while the daemon stays
healthy: /v2/health/live answers within 1 s and RSS stays within 200 MiB of where it was (HealthWatch);
the daemon runs with a capped address space, small limits, and traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.examples import build_example_repository
from tests import grpc_util
from tests.grpc_util import MODEL_INFER, MODEL_STREAM_INFER, PREFACE
from tests.health_watch import HealthWatch
from tests.http_util import accept_queue, call, open_sockets
from tests.models import copy_model
from tests.waiting import wait_until

ADDRESS_SPACE = 4 << 30
MESSAGE = 16 << 20


def _wait_ready(daemon, seconds: float = 60) -> None:
    """Health is open even when every other endpoint needs the token."""
    wait_until(lambda: call(daemon.port, "GET", "/v2/health/ready", timeout=2)[0] == 200, timeout=seconds,
               what="the daemon to get ready", interval=0.1)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("x") / "repo")


def test_unauthenticated_bombs_are_refused_before_they_are_read(module_daemon, repository):
    """Issue 22 item 2: 200 MiB calls without the token were each read and parsed, then refused."""
    daemon = module_daemon(repository, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), wait_loaded=False,
                           env={"APPLIANCE_PROTECT_INFERENCE": "true", "APPLIANCE_AUTH_EXEMPT_NETWORKS": ""})
    _wait_ready(daemon)
    bomb = grpc_util.bomb("simple", 64 << 20)
    with HealthWatch(daemon, keep_alive=False), grpc_util.channel(daemon.grpc_port) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        for _ in range(2):
            futures = [infer.future(bomb, timeout=60) for _ in range(8)]
            assert grpc_util.codes(futures) == ["UNAUTHENTICATED"] * 8


def test_concurrent_large_messages_are_received_within_the_memory_budget(module_daemon, repository):
    """Every message gRPC receives at once fits in max_request_memory_bytes: 24 concurrent 16 MiB calls
    against a 32 MiB budget (two receivers)."""
    daemon = module_daemon(repository, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), env={
        "APPLIANCE_MAX_REQUEST_BYTES": str(MESSAGE + 4096),
        "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(2 * MESSAGE + 8192),
    })
    bomb = grpc_util.bomb("simple", MESSAGE)
    with HealthWatch(daemon, keep_alive=False), grpc_util.channel(daemon.grpc_port) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        for _ in range(2):
            codes = grpc_util.codes([infer.future(bomb, timeout=120) for _ in range(24)])
            # Refused as what they are (the data does not fit the input) or for want of memory now.
            assert set(codes) <= {"INVALID_ARGUMENT", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, codes
            assert "INVALID_ARGUMENT" in codes
        good = pb.ModelInferRequest(model_name="simple", raw_input_contents=[bytes(64), bytes(64)], inputs=[
            pb.ModelInferRequest.InferInputTensor(name=n, datatype="INT32", shape=[1, 16]) for n in ("INPUT0",
                                                                                                    "INPUT1")])
        answer = pb.ModelInferResponse.FromString(infer(good.SerializeToString(), timeout=30))
        assert answer.model_name == "simple"


def test_malformed_messages_are_invalid_argument(module_daemon, repository):
    daemon = module_daemon(repository)
    with grpc_util.channel(daemon.grpc_port) as channel:
        for method in (MODEL_INFER, "/inference.GRPCInferenceService/ModelMetadata"):
            with pytest.raises(grpc.RpcError) as excinfo:
                channel.unary_unary(method)(b"\xff\xff\xff\xff", timeout=10)
            assert excinfo.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid" in excinfo.value.details()


@pytest.fixture(scope="module")
def sleepy(module_daemon, tmp_path_factory):
    """A daemon serving the Python model 'sleepy' (sleeps x[0] seconds) with a 64 MiB budget, streams
    of at most 4 pending requests, and a 2 s idle-stream timeout."""
    repo = tmp_path_factory.mktemp("sleepy") / "repo"
    copy_model(repo, "simple/sleepy")
    return module_daemon(repo, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), env={
        "APPLIANCE_MAX_REQUEST_BYTES": str(MESSAGE + 4096),
        "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(4 * MESSAGE),
        "APPLIANCE_GRPC_STREAM_MAX_PENDING": "4",
        "APPLIANCE_GRPC_STREAM_IDLE_TIMEOUT": "2",
        "APPLIANCE_GRPC_MAX_STREAMS": "3",
    })


def _sleep_request(seconds: float, sequence: int) -> bytes:
    request = pb.ModelInferRequest(model_name="sleepy", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[2])], raw_input_contents=[np.array([seconds, 0], np.float32).tobytes()])
    request.parameters["sequence_id"].int64_param = sequence
    return request.SerializeToString()


def test_a_stream_cannot_pile_requests_up_past_the_budget(sleepy):
    """Issue 22 item 3: requests of one sequence waited for the one before them before the budget, so a
    stream held as many as its client sent (100 x 30 MiB: 3.3 GB against a 1 GiB budget)."""
    bomb = grpc_util.bomb("sleepy", MESSAGE - 1024, sequence_id=7)
    requests = [_sleep_request(3, 7), *[bomb] * 40]
    with HealthWatch(sleepy, keep_alive=False), grpc_util.channel(sleepy.grpc_port) as channel:
        stream = channel.stream_stream(MODEL_STREAM_INFER)
        answers = [pb.ModelStreamInferResponse.FromString(raw) for raw in stream(iter(requests), timeout=120)]
    assert len(answers) == 41
    served = [a for a in answers if not a.error_message]
    assert len(served) == 1 and served[0].infer_response.model_name == "sleepy"
    assert all(a.error_message for a in answers if a is not served[0])


def test_streams_are_capped_and_idle_ones_end(sleepy):
    with grpc_util.channel(sleepy.grpc_port) as channel:
        stream = channel.stream_stream(MODEL_STREAM_INFER)
        held = threading.Event()

        def idle() -> Iterator[bytes]:
            held.wait(30)
            return
            yield

        calls = [stream(idle(), timeout=30) for _ in range(4)]
        try:
            started = time.monotonic()
            codes = []
            for call_ in calls:
                try:
                    list(call_)
                    codes.append("OK")
                except grpc.RpcError as error:
                    codes.append((error.code().name, error.details()))
            elapsed = time.monotonic() - started
        finally:
            held.set()
    refused = [c for c in codes if c[0] == "UNAVAILABLE" and "max_streams" in c[1]]
    idle_ended = [c for c in codes if c[0] == "UNAVAILABLE" and "stream_idle_timeout" in c[1]]
    assert len(refused) == 1 and len(idle_ended) == 3, codes
    assert elapsed < 10  # ended by the idle timeout (2 s), not the client's 30 s


def test_a_connection_flood_on_the_grpc_port_leaves_http_and_descriptors_alone(module_daemon, repository):
    """Issue 22 item 4: idle connections to the gRPC port were uncounted and took every descriptor."""
    daemon = module_daemon(repository, "--model-control-mode", "explicit", "--load-model", "*",
                           prefix=("prlimit", "--nofile=700"), env={"APPLIANCE_MAX_CONNECTIONS": "256"})
    with HealthWatch(daemon, keep_alive=False), open_sockets() as flood:
        for _ in range(900):
            sock = socket.create_connection(("127.0.0.1", daemon.grpc_port), timeout=5)
            with contextlib.suppress(OSError):
                sock.sendall(PREFACE)
            flood.append(sock)
        wait_until(lambda: accept_queue(daemon.grpc_port) == 0, timeout=30,
                   what="the daemon to take every connection of the flood")
        assert call(daemon.port, "GET", "/v2/health/live", timeout=1)[0] == 200  # a new HTTP connection
        assert call(daemon.port, "POST", "/v2/repository/models/simple/unload", b"{}")[0] == 200
        assert call(daemon.port, "POST", "/v2/repository/models/simple/load", b"{}")[0] == 200  # opens files
    assert "Too many open files" not in daemon.log()
