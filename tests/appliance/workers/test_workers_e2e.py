"""A daemon whose HTTP port is accepted by front-end workers (``workers = 2``): lane requests are framed
in the workers and answered by the daemon, other requests are handed over with their connection, the
connection cap counts every process, a worker that dies is restarted, and a stop drains what the workers
hold. (The lane's rules and answers through workers: tests/appliance/rest/test_lane_e2e.py runs against
such a daemon too.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.http as triton

from appliance.examples import build_example_repository
from tests.conftest import Daemon
from tests.processes import child_pids
from tests.waiting import wait_until

WORKERS = 2
INFER = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                              {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()


def _workers(daemon: Daemon) -> list[int]:
    return [pid for pid in child_pids(daemon.process.pid) if b"appliance.workers.worker" in
            open(f"/proc/{pid}/cmdline", "rb").read()]


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """One answer (status, body) read from ``sock`` (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1]), rest[:length]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("x") / "repo")


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, env={"APPLIANCE_WORKERS": str(WORKERS), "APPLIANCE_MAX_CONNECTIONS": "40",
                                          "APPLIANCE_GRPC_MAX_CONNECTIONS": "8"})


def test_the_workers_accept_and_the_daemon_answers(daemon):
    assert len(_workers(daemon)) == WORKERS
    assert "accepted by 2 front-end worker process(es)" in daemon.log()
    with triton.InferenceServerClient(daemon.url) as client:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(np.ones_like(a))
        for binary in (True, False):
            wanted = [triton.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            result = client.infer("simple", inputs, outputs=wanted)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        assert client.is_server_ready() and client.get_model_metadata("simple")["name"] == "simple"
        assert client.get_inference_statistics("simple")["model_stats"][0]["inference_count"] >= 2


def test_a_connection_is_handed_to_the_daemon_at_its_first_request_the_lane_does_not_serve(daemon):
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(INFER % (len(BODY), BODY))
        assert _answer(sock)[0] == 200  # the lane, in a worker
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + INFER % (len(BODY), BODY))  # pipelined
        status, body = _answer(sock)
        assert status == 200 and json.loads(body)["name"] == "triton"  # aiohttp, in the daemon
        status, body = _answer(sock)
        assert status == 200 and json.loads(body)["outputs"][0]["data"][:2] == [1, 2]


def test_the_lanes_rules_hold_in_a_worker(daemon):
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{}")
        status, body = _answer(sock)
        assert status == 403 and "Host" in json.loads(body)["error"]
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 40000 + b"\r\n\r\n")
        assert _answer(sock)[0] == 431


def test_the_connection_cap_counts_every_worker_and_the_daemon(daemon):
    held = []
    try:
        refused = 0
        for _ in range(60):  # the HTTP ports' share of max_connections is 32
            sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
            held.append(sock)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, _ = _answer(sock)
            refused += status == 503
        assert 60 - refused <= 32 + WORKERS  # a race may let one per worker past the cap
        assert refused >= 60 - 32 - WORKERS
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: _status(daemon) == 200, timeout=20, what="connections given back once closed")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _status(daemon: Daemon) -> int:
    try:
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return _answer(sock)[0]
    except OSError:
        return 0


def test_a_worker_that_dies_is_restarted_and_the_port_keeps_serving(daemon):
    before = _workers(daemon)
    os.kill(before[0], signal.SIGKILL)
    wait_until(lambda: _gone(before[0]), timeout=10, what="the killed worker gone")
    for _ in range(20):  # the other worker (and then the new one) accept
        assert _status(daemon) == 200
    wait_until(lambda: len(_workers(daemon)) == WORKERS and before[0] not in _workers(daemon), timeout=30,
               what="the dead worker restarted")
    assert "exited (code -9)" in daemon.log()


def _sleepy(seconds: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [seconds, 0.0]}]}).encode()
    return b"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_client_that_goes_away_gives_its_request_slot_back_in_the_daemon(start_daemon, sleepy_repository, workers):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_WORKERS": str(workers),
                                                  "APPLIANCE_MAX_CONCURRENT_REQUESTS": "2"})
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as running:
        running.sendall(_sleepy(12))
        wait_until(lambda: "sleeping 12 s" in daemon.log(), timeout=20, what="the first request running")
        started = time.monotonic()
        waiting = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
        waiting.sendall(_sleepy(0))  # queued behind it: the second of 2 slots
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as third:
            third.sendall(_sleepy(0))
            assert _answer(third)[0] == 503  # both slots held
        waiting.close()  # gone: its request leaves the daemon, and its slot with it

        def admitted() -> bool:  # refused at once (503) while both slots are held; else queued, unanswered
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as third:
                third.sendall(_sleepy(0))
                third.settimeout(1.0)
                try:
                    return _answer(third)[0] == 200
                except TimeoutError:
                    return True  # admitted, waiting behind the first

        wait_until(admitted, timeout=4, what="a request admitted in the slot given back, while the first still runs")
        assert time.monotonic() - started < 12  # the first still held its slot: the freed one was the cancelled's
        assert _answer(running)[0] == 200


def test_a_stop_lets_the_workers_finish_what_they_hold(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_WORKERS": "2"})
    workers = _workers(daemon)
    body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 0.0]}]}).encode()
    answers: list[int] = []

    def call() -> None:
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as sock:
            sock.sendall(b"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            answers.append(_answer(sock)[0])

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: "sleeping 1.5 s" in daemon.log(), timeout=20, what="the request running")
    assert daemon.stop() == 0
    caller.join(10)
    assert answers == [200]
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)
