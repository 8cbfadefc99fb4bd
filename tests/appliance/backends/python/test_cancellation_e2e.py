"""A client that goes away while a Python model's execute() runs: the model sees request.is_cancelled()
turn True within a moment (as Triton's L0_backend_python lifecycle test_execute_cancel and decoupled
test_decoupled_execute_cancel expect), over HTTP (a disconnect), gRPC ModelInfer (a cancelled call) and
ModelStreamInfer (stop_stream(cancel_requests=True)), and the instance serves the next request."""

from __future__ import annotations

import json
import queue
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import copy_model
from tests.waiting import wait_until

# backends/waits polls request.is_cancelled() from inside execute() until it turns True (or 30 s pass),
# and notes in seen.txt, beside its version directory, when it started and when it saw the cancellation;
# served as waits_decoupled (its decoupled.pbtxt) it does the same, polling its response sender too,
# streaming as it waits.

SEEN_WITHIN = 5.0
"""Seconds from the client's cancel to the model seeing it (it polls every 20-50 ms; the rest is slack
for a loaded machine)."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cancellation") / "repo"
    copy_model(root, "backends/waits")
    copy_model(root, "backends/waits", "waits_decoupled", config="decoupled")
    return root


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _seen(repository: Path, model: str) -> list[str]:
    path = repository / model / "seen.txt"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(repository: Path, model: str, line: str, timeout: float) -> float:
    """Seconds until the model noted ``line`` (fails the test after ``timeout``)."""
    start = time.monotonic()
    wait_until(lambda: line in _seen(repository, model), timeout=timeout, interval=0.02,
               what=f"the model to note {line!r}")
    return time.monotonic() - start


def _grpc_input(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return tensor


def _serves_on(daemon) -> None:
    with httpclient.InferenceServerClient(daemon.url) as client:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], np.int32))
        assert client.infer("waits", [tensor]).as_numpy("OUT").tolist() == [0]


def test_an_http_client_that_disconnects_cancels_the_running_request(daemon, repository):
    body = json.dumps({"id": "http", "inputs": [{"name": "IN", "shape": [1], "datatype": "INT32",
                                                   "data": [1]}]}).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/waits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait_for(repository, "waits", "started http", 30)
    assert _wait_for(repository, "waits", "cancelled http", SEEN_WITHIN) < SEEN_WITHIN
    _serves_on(daemon)


def test_a_cancelled_grpc_call_cancels_the_running_request(daemon, repository):
    answers: queue.Queue = queue.Queue()
    request_id = "grpc"
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        call = client.async_infer("waits", [_grpc_input(1)], lambda result, error: answers.put((result, error)),
                                  request_id=request_id)
        _wait_for(repository, "waits", f"started {request_id}", 30)
        assert answers.empty()
        call.cancel()
        assert _wait_for(repository, "waits", f"cancelled {request_id}", SEEN_WITHIN) < SEEN_WITHIN
        _, error = answers.get(timeout=10)
    assert error is not None and error.status() == "StatusCode.CANCELLED"
    _serves_on(daemon)


@pytest.mark.parametrize("model", ["waits", "waits_decoupled"])
def test_a_stream_stopped_with_cancel_requests_cancels_its_running_request(daemon, repository, model):
    request_id = f"stream-{model}"
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: None)
        client.async_stream_infer(model, [_grpc_input(1)], request_id=request_id)
        _wait_for(repository, model, f"started {request_id}", 30)
        client.stop_stream(cancel_requests=True)
    assert _wait_for(repository, model, f"cancelled {request_id}", SEEN_WITHIN) < SEEN_WITHIN
    _serves_on(daemon)
