"""The straight line leaves no garbage cycles: every object a request made is freed by its last reference,
not left for the cyclic garbage collector, whose passes cost each request (a cycle of eleven objects a
request once cost ~15 µs of CPU a request in bench.lean at 16 clients: the collector's passes and the
caches they cool)."""

from __future__ import annotations

import collections
import gc
import json
import socket

from tests.models import copy_model

_BODY = json.dumps({"inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})


def _request(connection: socket.socket) -> bytes:
    body = _BODY.encode()
    connection.sendall(b"POST /v2/models/arena_echo/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                       b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + int(
            answer.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
        answer += connection.recv(65536)
    return answer


def test_the_straight_line_frees_what_each_request_made_without_the_collector(serve_in_process, tmp_path):
    copy_model(tmp_path, "backends/arena_echo")
    server = serve_in_process(tmp_path)
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(4)]
    try:
        for _ in range(20):  # warm: first requests make what is kept (the head read once, the channel)
            for connection in connections:
                assert _request(connection).startswith(b"HTTP/1.1 200 ")
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
        try:
            for _ in range(25):
                for connection in connections:
                    assert _request(connection).startswith(b"HTTP/1.1 200 ")
            gc.collect()
            ours = collections.Counter(type(o).__qualname__ for o in gc.garbage
                                       if type(o).__module__.startswith("appliance"))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    finally:
        for connection in connections:
            connection.close()
    assert not ours, f"requests left cycles of the daemon's objects: {dict(ours)}"
