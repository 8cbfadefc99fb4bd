"""Hostile clients at the transport: slow heads, slow bodies, too many connections, compression bombs and
more request bytes than the memory budget. Each gets its 4xx/503 (or its connection closed), and all the
while the daemon stays healthy: /v2/health/live answers within 1 s and RSS stays within 200 MiB of
where it was. The daemon runs with small limits (and a capped address space) so that this is quick."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.http as triton

from appliance.examples import build_example_repository
from tests.health_watch import HealthWatch
from tests.http_util import call, open_sockets, unread
from tests.waiting import wait_until

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
MAX_CONNECTIONS = 64
HTTP_CONNECTIONS = MAX_CONNECTIONS - MAX_CONNECTIONS // 4  # the gRPC port takes a quarter of the bound
MAX_CONCURRENT = 8
MAX_BYTES = 8 << 20
MEMORY_BUDGET = 24 << 20
ADDRESS_SPACE = 4 << 30  # the daemon's own needs (~1.1 GiB) and room; a bomb that escapes fails fast

GOOD = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
INFER = "/v2/models/simple/infer"


@pytest.fixture(scope="module")
def daemon(module_daemon, tmp_path_factory):
    repository = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    daemon = module_daemon(repository, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), env={
        "APPLIANCE_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "APPLIANCE_BODY_TIMEOUT": str(BODY_TIMEOUT),
        "APPLIANCE_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "APPLIANCE_MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT),
        "APPLIANCE_MAX_REQUEST_BYTES": str(MAX_BYTES),
        "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(MEMORY_BUDGET),
    })
    for _ in range(3):  # warm the allocator up before anyone measures
        assert call(daemon.port, "POST", INFER, GOOD)[0] == 200
    return daemon


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _state(sock: socket.socket) -> bytes | None:
    """What the server sent (b"" once it closed), or None while it is open and silent."""
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        sock.setblocking(True)


def _refused(answer: tuple[int, dict, object]) -> tuple[int, dict, object] | None:
    """A call's answer once the server turned it away (503), None while it was still served."""
    return answer if answer[0] == 503 else None


def _read_response(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_slow_request_heads_are_closed_after_header_timeout(daemon):
    with HealthWatch(daemon, keep_alive=False), open_sockets() as slow:
        started = time.monotonic()
        for _ in range(40):
            slow.append(_connect(daemon.port))
            slow[-1].sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed_at: dict[int, float] = {}

        def all_closed() -> bool:
            for index, sock in enumerate(slow):
                if index in closed_at:
                    continue
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Trickle: 1\r\n")  # a header line now and then: the head never ends
                if _state(sock) == b"":
                    closed_at[index] = time.monotonic() - started
            return len(closed_at) == len(slow)

        wait_until(all_closed, timeout=HEADER_TIMEOUT + 3 - (time.monotonic() - started),
                   what="every slow head closed", interval=0.25)
        assert min(closed_at.values()) >= HEADER_TIMEOUT - 0.5 and max(closed_at.values()) <= HEADER_TIMEOUT + 2


def test_slow_bodies_time_out_and_never_lock_out_health(daemon):
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
    with HealthWatch(daemon, keep_alive=False), open_sockets() as slow:
        for _ in range(MAX_CONCURRENT):
            slow.append(_connect(daemon.port))
            slow[-1].sendall(head + b'{"inputs":')  # 10 of 1000 declared bytes
        # Once the server has taken the slow requests in, they hold every slot: a good request is turned away.
        status, headers, payload = wait_until(lambda: _refused(call(daemon.port, "POST", INFER, GOOD, timeout=5)),
                                              timeout=BODY_TIMEOUT, what="the slow bodies to take every slot")
        assert status == 503 and "max_concurrent_requests" in payload["error"]  # the slots are taken...
        assert call(daemon.port, "GET", "/v2/health/ready", timeout=1)[0] == 200  # ...but not health's
        assert call(daemon.port, "GET", "/metrics", timeout=1)[0] == 200
        answers = [_read_response(sock, BODY_TIMEOUT + 2) for sock in slow]
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b"body_timeout" in answer or b"Connection: close" in answer
        assert call(daemon.port, "POST", INFER, GOOD)[0] == 200  # the slots are free again


def test_connections_beyond_max_connections_get_a_short_503(daemon):
    with HealthWatch(daemon, keep_alive=True), open_sockets() as idle:
        opened = time.monotonic()
        for _ in range(HTTP_CONNECTIONS + 10):
            idle.append(_connect(daemon.port))
        states: list[bytes | None] = [None] * len(idle)

        def answered() -> bool:  # the connections over the bound get their 503 and are closed
            for index, sock in enumerate(idle):
                if states[index] is None:
                    states[index] = _state(sock)
            return sum(1 for s in states if s) >= 10

        wait_until(answered, timeout=5, what="the connections over max_connections answered", interval=0.05)
        refused = [s for s in states if s]
        assert len(refused) >= 10 and all(s.startswith(b"HTTP/1.1 503") for s in refused), refused[:2]
        assert b"Retry-After: 1" in refused[0] and b"max_connections" in refused[0]
        assert sum(s is None for s in states) >= HTTP_CONNECTIONS - 2  # the others are held open, unqueued
        newcomer = _connect(daemon.port)
        idle.append(newcomer)
        started = time.monotonic()
        assert _read_response(newcomer, 2).startswith(b"HTTP/1.1 503")
        assert time.monotonic() - started < 0.5  # answered at once, not queued
        # The idle connections never send a head: they are closed after header_timeout, and the
        # server takes new connections again.
        held = [sock for sock, state in zip(idle[:len(states)], states, strict=True) if state is None]
        wait_until(lambda: all(_state(sock) == b"" for sock in held), timeout=HEADER_TIMEOUT + 5,
                   what="the idle connections closed after header_timeout", interval=0.1)
        assert time.monotonic() - opened >= HEADER_TIMEOUT - 0.5  # closed by header_timeout, not before
        assert call(daemon.port, "GET", "/v2/health/live", timeout=1)[0] == 200


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    bomb = gzip.compress(b"\0" * (256 << 20), 9)  # 256 MiB from ~260 KB, as in the finding
    assert len(bomb) < MAX_BYTES
    return bomb


def test_gzip_bombs_stop_at_the_limit(daemon, gzip_bomb):
    results: list[tuple[int, object]] = []

    def bomb() -> None:
        for _ in range(5):
            status, _, payload = call(daemon.port, "POST", INFER, gzip_bomb, {"Content-Encoding": "gzip"}, timeout=20)
            results.append((status, payload))

    with HealthWatch(daemon, keep_alive=False):
        threads = [threading.Thread(target=bomb) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len(results) == 30
    # Each bomb inflates to max_request_bytes and stops (413); bombs beyond what the memory budget holds
    # at once are turned away before that (503).
    assert {status for status, _ in results} <= {413, 503}, results[:3]
    assert all("inflates to more than" in p["error"] for status, p in results if status == 413)
    assert all("max_request_memory_bytes" in p["error"] for status, p in results if status == 503)
    # How many overlap (503) depends on the box's speed; some must have been inflated to the limit.
    assert any(status == 413 for status, _ in results)


@pytest.mark.parametrize("coding,body,status,message", [
    ("gzip", b"\x1f\x8b\x08\x00" + b"junk" * 100, 400, "not valid gzip"),
    ("deflate", b"\x78\x9c" + b"\xff" * 100, 400, "not valid deflate"),
    ("gzip", gzip.compress(b"x" * 100_000, mtime=0)[:-100], 400, "truncated"),
    ("br", b"\x0b\x02\x80hello\x03", 415, "gzip or deflate"),
    ("zstd", b"\x28\xb5\x2f\xfd", 415, "gzip or deflate"),
])
def test_bad_compressed_bodies(daemon, coding, body, status, message):
    got, headers, payload = call(daemon.port, "POST", INFER, body, {"Content-Encoding": coding})
    assert got == status and message in payload["error"], (got, payload)
    if status == 415:
        assert "gzip" in headers["Accept-Encoding"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_tritonclient(daemon, algorithm):
    with triton.InferenceServerClient(daemon.url) as client:
        inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        result = client.infer("simple", inputs, request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(1, 17, dtype=np.int32).reshape(1, 16))


def test_request_bytes_beyond_the_memory_budget_get_503(daemon):
    declared = MAX_BYTES
    sent = 7 << 20  # three of these hold 21 of the 24 MiB budget
    head = f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n\r\n".encode()
    with HealthWatch(daemon, keep_alive=False), open_sockets() as holders:
        for _ in range(3):
            holders.append(_connect(daemon.port))
            holders[-1].sendall(head + b"\0" * sent)
        wait_until(lambda: not any(unread(sock) for sock in holders), timeout=30,
                   what="the daemon to read (and hold) what the holders sent")
        late = _connect(daemon.port)
        holders.append(late)

        def send() -> None:
            with contextlib.suppress(OSError):  # the server may answer (and stop reading) midway
                late.sendall(head + b"\0" * sent)

        sender = threading.Thread(target=send)
        sender.start()
        answer = _read_response(late, BODY_TIMEOUT)
        sender.join(15)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b"Retry-After: 1" in answer
        assert b"max_request_memory_bytes" in answer  # the body comes in the same write as the head
        for sock in holders[:3]:  # the holders stall: they time out, and give their bytes back
            assert _read_response(sock, BODY_TIMEOUT + 2).startswith(b"HTTP/1.1 408")
    assert call(daemon.port, "POST", INFER, GOOD)[0] == 200


def test_the_daemon_logged_no_tracebacks(daemon):
    log = daemon.log()
    assert "Traceback" not in log, log[-3000:]
