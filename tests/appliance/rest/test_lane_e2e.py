"""The infer lane against aiohttp's route: the same answers, the same rules, its own connection handling.

Two daemons on the example repository, one with the lane and one without (``http_infer_lane = false``);
aiohttp's answers carry a ``Server`` header and the lane's do not, which tells who served each one."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.http as triton

from appliance.examples import build_example_repository

TIMEOUT = 1.0  # header_timeout and body_timeout
REMOTE = "127.0.0.2"  # not in the exempt networks: needs the token (protect_inference is on)
DATA = list(range(16))
JSON_BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": DATA},
                        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
INFER = "/v2/models/simple/infer"


@pytest.fixture(scope="module")
def daemons(module_daemon, tmp_path_factory):
    repository = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    env = {"APPLIANCE_HEADER_TIMEOUT": str(TIMEOUT), "APPLIANCE_BODY_TIMEOUT": str(TIMEOUT),
           "APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32", "APPLIANCE_PROTECT_INFERENCE": "true"}
    lane = module_daemon(repository, env=env)
    plain = module_daemon(repository, env={**env, "APPLIANCE_HTTP_INFER_LANE": "false"})
    return lane, plain


def _token(daemon) -> str:
    return (daemon.log_path.parent / "auth-token").read_text().strip()


class _Connection:
    """A raw HTTP/1.1 connection: send any bytes, read answers one by one."""

    def __init__(self, port: int, source: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10,
                                             source_address=(source, 0) if source else None)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        status_line = self.file.readline()
        assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), status_line
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self.file.readline(), 16):
                body += self.file.read(size)
                self.file.readline()
            self.file.readline()
        else:
            body = self.file.read(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, body

    def closed(self) -> bool:
        return self.file.read(1) == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _request(body: bytes, path: str = INFER, headers: dict[str, str] | None = None, method: str = "POST",
             version: str = "HTTP/1.1") -> bytes:
    fields = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body)),
              **(headers or {})}
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items() if v is not None)
    return head.encode("latin-1") + b"\r\n" + body


def _exchange(daemon, data: bytes, source: str | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = _Connection(daemon.port, source)
    try:
        connection.send(data)
        return connection.answer()
    finally:
        connection.close()


def _binary_request() -> tuple[bytes, int]:
    inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=True)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32), binary_data=True)
    outputs = [triton.InferRequestedOutput("OUTPUT0", binary_data=True), triton.InferRequestedOutput("OUTPUT1")]
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs)
    return body, json_size


def _cases() -> dict[str, bytes]:
    binary, json_size = _binary_request()
    bad_shape = {"inputs": [{**JSON_BODY["inputs"][0], "shape": [1, 15]}, JSON_BODY["inputs"][1]]}
    shm = {"inputs": [{**JSON_BODY["inputs"][0], "data": None,
                       "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}},
                      JSON_BODY["inputs"][1]]}
    return {
        "json": _request(json.dumps(JSON_BODY).encode()),
        "version": _request(json.dumps(JSON_BODY).encode(), "/v2/models/simple/versions/1/infer"),
        "binary": _request(binary, headers={"Content-Type": "application/octet-stream",
                                            "Inference-Header-Content-Length": str(json_size)}),
        "raw binary, two inputs": _request(b"\0" * 64, headers={"Inference-Header-Content-Length": "0"}),
        "bad header length": _request(b"{}", headers={"Inference-Header-Content-Length": "x"}),
        "unknown model": _request(json.dumps(JSON_BODY).encode(), "/v2/models/nothere/infer"),
        "unknown version": _request(json.dumps(JSON_BODY).encode(), "/v2/models/simple/versions/9/infer"),
        "bad shape": _request(json.dumps(bad_shape).encode()),
        "not json": _request(b"{not json"),
        "host of another site": _request(json.dumps(JSON_BODY).encode(), headers={"Host": "evil.example"}),
        "shared memory from a form": _request(json.dumps(shm).encode(), headers={"Content-Type": "text/plain"}),
        "shared memory from another origin": _request(json.dumps(shm).encode(),
                                                      headers={"Origin": "http://evil.example"}),
    }


def _get(path: str, headers: dict[str, str] | None = None) -> bytes:
    return _request(b"", path, {"Content-Type": None, "Content-Length": None, **(headers or {})}, method="GET")


_READS = {
    "live": _get("/v2/health/live"),
    "ready": _get("/v2/health/ready"),
    "model ready": _get("/v2/models/simple/ready"),
    "model version ready": _get("/v2/models/simple/versions/1/ready"),
    "unknown model ready": _get("/v2/models/nothere/ready"),
    "metadata": _get("/v2/models/simple"),
    "version metadata": _get("/v2/models/simple/versions/1"),
    "unknown metadata": _get("/v2/models/nothere"),
    "config": _get("/v2/models/simple/config"),
    "unknown version config": _get("/v2/models/simple/versions/7/config"),
    "read from another site": _get("/v2/models/simple", {"Host": "evil.example"}),
}


@pytest.mark.parametrize("case", [*_cases(), *_READS])
def test_the_lane_answers_as_aiohttps_route(daemons, case):
    lane, plain = daemons
    data = {**_cases(), **_READS}[case]
    status, headers, body = _exchange(lane, data)
    want_status, want_headers, want_body = _exchange(plain, data)
    assert "server" not in headers and "aiohttp" in want_headers["server"]  # each was served where meant
    assert status == want_status, body
    assert headers.get("content-type") == want_headers.get("content-type")
    assert headers.get("inference-header-content-length") == want_headers.get("inference-header-content-length")
    assert "date" in headers
    if headers.get("content-type") == "application/json":
        assert json.loads(body) == json.loads(want_body)
    else:
        assert body == want_body


def test_the_token_is_asked_for_on_the_lane_too(daemons):
    lane, plain = daemons
    data = _request(json.dumps(JSON_BODY).encode())
    for daemon in (lane, plain):
        status, headers, body = _exchange(daemon, data, source=REMOTE)
        assert status == 401 and "Bearer" in headers["www-authenticate"], body
        assert ("server" in headers) == (daemon is plain)
        authorized = _request(json.dumps(JSON_BODY).encode(), headers={"Authorization": f"Bearer {_token(daemon)}"})
        assert _exchange(daemon, authorized, source=REMOTE)[0] == 200


def _outputs(body: bytes) -> list[int]:
    return json.loads(body)["outputs"][0]["data"]


def test_pipelined_requests_are_answered_in_order_and_the_first_other_hands_the_connection_over(daemons):
    lane, _ = daemons
    second = {"inputs": [{**JSON_BODY["inputs"][0], "data": [7] * 16}, JSON_BODY["inputs"][1]]}
    connection = _Connection(lane.port)
    try:
        connection.send(_request(json.dumps(JSON_BODY).encode()) + _request(json.dumps(second).encode())
                        + b"GET /v2/models/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                        + _request(json.dumps(second).encode()))
        answers = [connection.answer() for _ in range(4)]
    finally:
        connection.close()
    assert [status for status, _, _ in answers] == [200] * 4
    assert ["server" in headers for _, headers, _ in answers] == [False, False, True, True]
    assert _outputs(answers[0][2]) == [d + 1 for d in DATA]
    assert _outputs(answers[1][2]) == [8] * 16 == _outputs(answers[3][2])


def test_requests_the_lane_does_not_take_are_served_by_aiohttp(daemons):
    lane, _ = daemons
    payload = json.dumps(JSON_BODY).encode()
    big = payload[:-1] + b" " * (70 << 10) + b"}"  # more than the lane holds
    chunked = _request(b"", headers={"Content-Length": None, "Transfer-Encoding": "chunked"}) + (
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
    compressed = _request(payload, headers={"Accept-Encoding": "gzip"})
    old = _request(payload, version="HTTP/1.0")
    for data in (_request(big), chunked, compressed, old):
        status, headers, body = _exchange(lane, data)
        assert status == 200 and "aiohttp" in headers["server"], body
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        assert _outputs(body) == [d + 1 for d in DATA]


def test_a_chunked_body_with_a_content_length_is_read_as_chunked_then_the_connection_closes(daemons):
    """RFC 9112 6.3, as Triton's qa test_content_encoding_chunked_manually sends it (requests adds the
    Content-Length of the already chunked bytes): the chunks are the body, and nothing after it on that
    connection is read, so a request smuggled behind the Content-Length never runs. (Without the lane,
    aiohttp refuses such a request whole, as RFC 9112 allows.)"""
    lane, plain = daemons
    payload = json.dumps(JSON_BODY).encode()
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for daemon, tail in ((lane, b""), (lane, smuggled), (plain, b""), (plain, smuggled)):
        connection = _Connection(daemon.port)
        try:
            connection.send(_request(chunks, headers={"Transfer-Encoding": "chunked"}) + tail)
            status, headers, body = connection.answer()
            if daemon is lane and not tail:
                assert status == 200 and _outputs(body) == [d + 1 for d in DATA], body
                assert headers.get("connection") == "close"
            else:  # refused whole (the bytes after it, or both lengths without the lane): never two answers
                assert status == 400, body
            assert connection.closed()  # the GET behind it was never answered
        finally:
            connection.close()


def test_connection_close_is_honoured(daemons):
    lane, _ = daemons
    connection = _Connection(lane.port)
    try:
        connection.send(_request(json.dumps(JSON_BODY).encode(), headers={"Connection": "close"}))
        status, headers, _ = connection.answer()
        assert status == 200 and "server" not in headers
        assert connection.closed()
    finally:
        connection.close()


def test_a_slow_head_is_dropped_and_a_slow_body_gets_408(daemons):
    lane, _ = daemons
    slow_head, slow_body = _Connection(lane.port), _Connection(lane.port)
    try:
        started = time.monotonic()
        slow_head.send(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data = _request(json.dumps(JSON_BODY).encode())
        slow_body.send(data[:-10])
        status, headers, body = slow_body.answer()
        assert status == 408 and headers["connection"] == "close" and "body_timeout" in json.loads(body)["error"]
        assert slow_body.closed() and slow_head.closed()
        assert time.monotonic() - started < 6 * TIMEOUT  # dropped at about TIMEOUT; 6x leaves a busy box its time
        # and an idle keep-alive connection is closed after header_timeout, as aiohttp's are
        idle = _Connection(lane.port)
        idle.send(data)
        assert idle.answer()[0] == 200
        assert idle.closed()
        idle.close()
    finally:
        slow_head.close()
        slow_body.close()


def test_a_client_that_goes_away_mid_request_leaves_the_daemon_serving(daemons):
    lane, _ = daemons
    for _ in range(20):
        connection = _Connection(lane.port)
        connection.send(_request(json.dumps(JSON_BODY).encode()))
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        connection.close()  # a reset, possibly before the answer
    status, _, body = _exchange(lane, _request(json.dumps(JSON_BODY).encode()))
    assert status == 200 and _outputs(body) == [d + 1 for d in DATA]


def test_a_refusal_comes_before_the_body_and_the_rest_of_that_body_is_dropped(daemons):
    lane, _ = daemons
    data = _request(json.dumps(JSON_BODY).encode())
    connection = _Connection(lane.port, source=REMOTE)
    try:
        connection.send(data[:-20])  # the head and most of the body, from a client without the token
        status, headers, _ = connection.answer()
        assert status == 401 and "server" not in headers
        token = {"Authorization": f"Bearer {_token(lane)}"}
        connection.send(data[-20:] + _request(json.dumps(JSON_BODY).encode(), headers=token))
        status, _, body = connection.answer()  # the refused body's rest was not taken for a request
        assert status == 200 and _outputs(body) == [d + 1 for d in DATA]
    finally:
        connection.close()


def test_a_pipelined_flood_pauses_reading_and_every_answer_comes_in_order(daemons):
    lane, _ = daemons
    bodies = [{"inputs": [{**JSON_BODY["inputs"][0], "data": [i] * 16}, JSON_BODY["inputs"][1]]} for i in range(1000)]
    data = b"".join(_request(json.dumps(body).encode()) for body in bodies)  # ~380 KB: far more than the lane holds
    assert len(data) > 4 * (80 << 10)
    connection = _Connection(lane.port)
    try:
        sender = threading.Thread(target=connection.send, args=(data,))
        sender.start()  # sent faster than answered: the server pauses reading rather than hold it all
        answers = [connection.answer() for _ in bodies]
        sender.join(10)
    finally:
        connection.close()
    assert all(status == 200 and "server" not in headers for status, headers, _ in answers)
    assert [_outputs(body)[0] for _, _, body in answers] == [i + 1 for i in range(1000)]


def _refused(daemon, data: bytes) -> tuple[int, dict[str, str], dict, float]:
    """Send ``data`` on a fresh connection: the answer, its JSON body, the seconds it took; the connection
    must close after it."""
    connection = _Connection(daemon.port)
    try:
        started = time.monotonic()
        connection.send(data)
        status, headers, body = connection.answer()
        elapsed = time.monotonic() - started
        assert headers.get("connection") == "close" and connection.closed()
    finally:
        connection.close()
    return status, headers, json.loads(body), elapsed


@pytest.mark.parametrize("data", [
    _request(json.dumps(JSON_BODY).encode(), headers={"Host": None}),
    _get("/v2/health/live", {"Host": None}),
    b"GET /v2/models/stats HTTP/1.1\r\n\r\n",  # not a lane request: refused before it is handed over
])
def test_an_http_1_1_request_without_host_gets_400(daemons, data):
    lane, _ = daemons
    status, headers, payload, _ = _refused(lane, data)
    assert status == 400 and "server" not in headers
    assert "Host" in payload["error"] and "send" in payload["error"]


def test_two_host_headers_get_400(daemons):
    lane, _ = daemons
    data = _get("/v2/health/live").replace(b"\r\n\r\n", b"\r\nHost: evil.example\r\n\r\n")
    status, _, payload, _ = _refused(lane, data)
    assert status == 400 and "Host" in payload["error"]


@pytest.mark.parametrize("line_bytes", [9 << 10, 16 << 10])
def test_a_long_header_line_gets_431(daemons, line_bytes):
    lane, _ = daemons
    data = _request(json.dumps(JSON_BODY).encode(), headers={"X-Big": "a" * line_bytes})
    status, headers, payload, _ = _refused(lane, data)
    assert status == 431 and "server" not in headers and "8192" in payload["error"]


def test_a_long_head_gets_431_and_leaves_other_connections_alone(daemons):
    lane, _ = daemons
    good = _Connection(lane.port)
    try:
        good.send(_get("/v2/health/live"))
        assert good.answer()[0] == 200
        many = {f"X-Field-{i}": "a" * 4000 for i in range(12)}  # 48 KB of short lines
        status, _, payload, _ = _refused(lane, _request(json.dumps(JSON_BODY).encode(), headers=many))
        assert status == 431 and "32768" in payload["error"]
        good.send(_request(json.dumps(JSON_BODY).encode()))  # the other connection is still served
        status, _, body = good.answer()
        assert status == 200 and _outputs(body) == [d + 1 for d in DATA]
    finally:
        good.close()


@pytest.mark.parametrize("data", [
    b"GET /v2/health/live HTTP/1.1\nHost: 127.0.0.1\n\n",
    b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\nContent-Length: 2\n\n{}",
])
def test_a_bare_lf_head_gets_400_at_once(daemons, data):
    lane, _ = daemons
    status, _, payload, elapsed = _refused(lane, data)
    assert status == 400 and "CRLF" in payload["error"]
    assert elapsed < TIMEOUT / 2  # answered, not left to header_timeout


def test_an_answer_after_which_the_lane_closes_says_connection_close(daemons):
    lane, _ = daemons
    for data in (_request(json.dumps(JSON_BODY).encode(), headers={"Connection": "close"}),
                 _get("/v2/models/nothere", {"Connection": "close"})):
        connection = _Connection(lane.port)
        try:
            connection.send(data)
            status, headers, _ = connection.answer()
            assert status < 500 and "server" not in headers
            assert headers["connection"] == "close" and connection.closed()
        finally:
            connection.close()
    keep = _Connection(lane.port)  # and one that stays open says nothing of the kind
    try:
        keep.send(_get("/v2/health/live"))
        status, headers, _ = keep.answer()
        assert status == 200 and "connection" not in headers
    finally:
        keep.close()


def test_a_head_sent_again_is_answered_again_and_one_that_differs_is_read_afresh(daemons):
    lane, _ = daemons
    body = json.dumps(JSON_BODY).encode()
    token = {"Authorization": f"Bearer {_token(lane)}"}
    wrong = {"Authorization": "Bearer not-the-token-0123456789abcdef"}
    connection = _Connection(lane.port, source="127.0.0.2")  # not exempt: the token is checked
    try:
        # A head sent again keeps the access check it passed, never one it failed.
        for headers in (token, token, wrong, wrong, token, {**token, "Host": "rebound.example"}, token):
            connection.send(_request(body, headers=headers))
        answers = [connection.answer() for _ in range(7)]
    finally:
        connection.close()
    statuses = [status for status, _, _ in answers]
    assert statuses[:5] == [200, 200, 401, 401, 200]
    assert statuses[5] in (400, 403, 421) and b"Host" in answers[5][2]
    assert statuses[6] == 200
    assert _outputs(answers[0][2]) == _outputs(answers[6][2]) == [d + 1 for d in DATA]


def test_heads_that_differ_only_in_their_lengths_are_each_answered_as_sent(daemons):
    lane, _ = daemons
    token = {"Authorization": f"Bearer {_token(lane)}"}
    scales = (1, 1000, 7, 100000, 3)
    bodies = [json.dumps({"inputs": [{**JSON_BODY["inputs"][0], "data": [d * s for d in DATA]},
                                     JSON_BODY["inputs"][1]]}).encode() for s in scales]
    assert len({len(body) for body in bodies}) == len(bodies)
    inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=True)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32), binary_data=True)
    binary = [triton.InferenceServerClient.generate_request_body(inputs, request_id="r" * n) for n in (1, 12, 3)]
    connection = _Connection(lane.port, source="127.0.0.2")  # not exempt: the token is checked every time
    try:
        for scale, body in zip(scales, bodies):  # one at a time: each request whole in one read
            connection.send(_request(body, headers=token))
            status, headers, answer = connection.answer()
            assert status == 200 and "server" not in headers  # the lane's
            assert _outputs(answer) == [d * scale + 1 for d in DATA]
        connection.send(b"".join(_request(body, headers={**token, "Content-Type": "application/octet-stream",
                                                         "Inference-Header-Content-Length": str(size)})
                                 for body, size in binary))  # pipelined: heads read from the buffer
        for n in (1, 12, 3):
            status, headers, answer = connection.answer()
            header = answer[:int(headers["inference-header-content-length"])]
            assert status == 200 and json.loads(header)["id"] == "r" * n
        # Other lengths, the request in pieces: its head and half its body, then the rest; then a head cut
        # in two (read afresh once whole).
        for scale, body in ((1000, bodies[1]), (7, bodies[2])):
            data = _request(body, headers=token)
            cut = data.index(b"\r\n\r\n") + 4 + (len(body) // 2 if scale == 1000 else -10)
            connection.send(data[:cut])
            time.sleep(0.05)
            connection.send(data[cut:])
            status, _, answer = connection.answer()
            assert status == 200 and _outputs(answer) == [d * scale + 1 for d in DATA]
        # The same head with a value llhttp refuses is refused as on a fresh connection.
        connection.send(_request(bodies[0], headers=token).replace(b"Content-Length: ", b"Content-Length: +", 1))
        status, _, answer = connection.answer()
        assert status == 400 and connection.closed()
    finally:
        connection.close()
    fresh = _exchange(lane, _request(bodies[0], headers=token).replace(b"Content-Length: ", b"Content-Length: +", 1),
                      source="127.0.0.2")
    assert fresh[0] == 400
    wrong = _Connection(lane.port, source="127.0.0.2")
    try:  # a head that failed its access check fails it again with other lengths
        for body in bodies[:2]:
            wrong.send(_request(body, headers={"Authorization": "Bearer not-the-token-0123456789abcdef"}))
            assert wrong.answer()[0] == 401
    finally:
        wrong.close()


def test_binary_requests_with_one_header_are_each_answered_with_their_own_tensors(daemons):
    """The same JSON header again and again (decoded from its plan from the third time: binary_header),
    other tensor bytes each time, a JSON request and a header with another shape between: every answer is
    its own request's."""
    lane, _ = daemons
    token = {"Authorization": f"Bearer {_token(lane)}"}

    def binary(step: int, columns: int = 16) -> bytes:
        inputs = [triton.InferInput(name, [1, columns], "INT32") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(np.arange(columns, dtype=np.int32).reshape(1, columns) * step, binary_data=True)
        inputs[1].set_data_from_numpy(np.full((1, columns), step, np.int32), binary_data=True)
        outputs = [triton.InferRequestedOutput("OUTPUT0", binary_data=True),
                   triton.InferRequestedOutput("OUTPUT1", binary_data=True)]
        body, size = triton.InferenceServerClient.generate_request_body(inputs, outputs)
        return _request(body, headers={**token, "Content-Type": "application/octet-stream",
                                       "Inference-Header-Content-Length": str(size)})

    connection = _Connection(lane.port, source="127.0.0.2")
    try:
        for step in (1, 2, 3, 4, 5, 6, 7):
            if step == 5:  # another request between (the binary requests' head and plan are made again after it)
                connection.send(_request(json.dumps(JSON_BODY).encode(), headers=token))
                status, _, answer = connection.answer()
                assert status == 200 and _outputs(answer) == [d + 1 for d in DATA]
            connection.send(binary(step))
            status, headers, answer = connection.answer()
            size = int(headers["inference-header-content-length"])
            header = json.loads(answer[:size])
            assert status == 200 and [o["name"] for o in header["outputs"]] == ["OUTPUT0", "OUTPUT1"]
            sums = np.frombuffer(answer[size:size + 64], np.int32)
            differences = np.frombuffer(answer[size + 64:], np.int32)
            assert sums.tolist() == [d * step + step for d in DATA]
            assert differences.tolist() == [d * step - step for d in DATA]
        connection.send(binary(3, columns=15))  # the same model, a shape it does not take: refused as ever
        status, _, answer = connection.answer()
        assert status == 400 and "error" in json.loads(answer)
    finally:
        connection.close()
