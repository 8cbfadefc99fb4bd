"""The straight line leaves no garbage cycles: every object a request made is freed by its last reference,
not left for the cyclic garbage collector, whose passes cost each request (a cycle of eleven objects a
request once cost ~15 µs of CPU a request in bench.lean at 16 clients: the collector's passes and the
caches they cool)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.garbage import appliance_cycles
from tests.models import copy_model

_ECHO = {"inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
_STEP = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}


def _body(model: str, sequence: int, first: bool) -> bytes:
    if model == "arena_echo":
        return json.dumps(_ECHO).encode()
    return json.dumps({**_STEP, "parameters": {"sequence_id": sequence, "sequence_start": first}}).encode()


def _request(connection: socket.socket, model: str, sequence: int = 0, first: bool = False) -> bytes:
    body = _body(model, sequence, first)
    connection.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                       b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (model.encode(), len(body), body))
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + int(
            answer.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
        answer += connection.recv(65536)
    return answer


@pytest.mark.parametrize("model", ["backends/arena_echo", "sequence/py_accumulator"])
def test_the_straight_line_frees_what_each_request_made_without_the_collector(serve_in_process, tmp_path, model):
    copy_model(tmp_path, model)
    name = model.rsplit("/", 1)[1]
    server = serve_in_process(tmp_path)
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(4)]
    try:
        for step in range(20):  # warm: first requests make what is kept (the head read once, the channel)
            for sequence, connection in enumerate(connections, start=1):  # a sequence per connection
                assert _request(connection, name, sequence, step == 0).startswith(b"HTTP/1.1 200 ")
        with appliance_cycles() as ours:
            for _ in range(25):
                for sequence, connection in enumerate(connections, start=1):
                    assert _request(connection, name, sequence).startswith(b"HTTP/1.1 200 ")
    finally:
        for connection in connections:
            connection.close()
    assert not ours, f"requests left cycles of the daemon's objects: {dict(ours)}"
