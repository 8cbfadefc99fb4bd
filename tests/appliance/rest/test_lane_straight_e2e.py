"""The lane's straight line (a request whose body came with its head, served without a task): a client
that goes away takes its request back wherever it is, and lets go of what it held."""

from __future__ import annotations

import json
import socket

from tests.http_util import call
from tests.waiting import wait_until


def _request(seconds: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [seconds, 0.0]}]}).encode()
    head = (f"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


def _sent(daemon, seconds: float) -> socket.socket:
    """A connection that has sent one request, head and body in one piece."""
    connection = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    connection.sendall(_request(seconds))
    return connection


def _failures(daemon) -> tuple[int, int]:
    status, _, stats = call(daemon.port, "GET", "/v2/models/sleepy/stats")
    assert status == 200
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def test_a_running_request_whose_client_goes_away_lets_go_of_its_admission(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": "1"})
    gone = _sent(daemon, 1.5)
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
