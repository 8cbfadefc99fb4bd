"""The lane's straight line (a request whose body came with its head, served without a task; one whose
body came later, by its task through ``DataPlane.straight``): a client that goes away takes its request
back wherever it is, and lets go of what it held."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.http_util import call
from tests.waiting import wait_until


def _request(seconds: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [seconds, 0.0]}]}).encode()
    head = (f"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


def _sent(daemon, seconds: float, body_later: bool = False) -> socket.socket:
    """A connection that has sent one request, head and body in one piece (``body_later``: the body once
    the head has been read alone)."""
    connection = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    request = _request(seconds)
    if body_later:
        head_end = request.index(b"\r\n\r\n") + 4
        connection.sendall(request[:head_end])
        time.sleep(0.2)
        request = request[head_end:]
    connection.sendall(request)
    return connection


def _failures(daemon) -> tuple[int, int]:
    status, _, stats = call(daemon.port, "GET", "/v2/models/sleepy/stats")
    assert status == 200
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


@pytest.mark.parametrize("body_later", [False, True], ids=["with-its-head", "after-its-head"])
def test_a_running_request_whose_client_goes_away_lets_go_of_its_admission(start_daemon, sleepy_repository,
                                                                            body_later):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": "1"})
    gone = _sent(daemon, 1.5, body_later)
    wait_until(lambda: "sleepy: sleeping 1.5 s" in daemon.log(), timeout=30, what="the request to run in the model")
    gone.close()
    # The one admission place is free again at once (the next request then waits for the model's instance).
    wait_until(lambda: _failures(daemon)[1] == 1, timeout=30, what="the withdrawn request to count as failed")
    status, _, answer = call(daemon.port, "POST", "/v2/models/sleepy/infer",
                             {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [0.0, 1.0]}]})
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [0.0, 1.0]
    assert _failures(daemon) == (1, 1)


def test_a_queued_request_whose_client_goes_away_never_runs(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository)
    first = _sent(daemon, 1.0)
    wait_until(lambda: "sleepy: sleeping 1 s" in daemon.log(), timeout=30, what="the first request to run")
    second = _sent(daemon, 0.5)  # handed to the model's process behind the first (a pipeline of two)
    queued = _sent(daemon, 0.25)
    wait_until(lambda: _pending(daemon) == 1, timeout=30, what="the third request to queue")
    queued.close()
    wait_until(lambda: _pending(daemon) == 0, timeout=30, what="the third request to leave the queue")
    for connection in (first, second):
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
        connection.close()
    status, _, _ = call(daemon.port, "POST", "/v2/models/sleepy/infer",
                        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [0.0, 0.0]}]})
    assert status == 200
    assert "sleepy: sleeping 0.25 s" not in daemon.log()


def _pending(daemon) -> float:
    _, _, metrics = call(daemon.port, "GET", "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
               if line.startswith('nv_inference_pending_request_count{model="sleepy"'))


def test_a_body_that_comes_after_its_head_is_served_on_the_straight_line(serve_in_process, tmp_path,
                                                                          awaited_requests):
    from tests.models import copy_model

    copy_model(tmp_path, "simple/sleepy")
    server = serve_in_process(tmp_path)
    for _ in range(2):
        connection = _sent(server, 0.0, body_later=True)
        with connection:
            assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert awaited_requests == []
    # An unknown model's request is refused before its body comes (the awaited path reads it only once
    # the model is found).
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"POST /v2/models/nowhere/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 404 ")
    assert awaited_requests == ["HTTP end point"]
