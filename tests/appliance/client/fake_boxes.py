"""Fake boxes for the routing client's tests: tiny HTTP servers on 127.0.0.1 that answer the repository
index with the models they are given and answer /infer as told (ok, 503, 500, 400, 404, slow), counting
what they receive. The real daemon is covered in tests/appliance/mdns/fleet_scenario.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from appliance.client import Box


class FakeBox:
    def __init__(self, name: str, models: set[str], answer: str = "ok", delay: float = 0.0) -> None:
        self.name = name
        self.models = models
        self.answer = answer
        """ok | 503 | 500 | 400 | 404"""
        self.delay = delay
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()  # headers and body go in two writes: without this, Nagle delays each answer
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _send(self, status: int, body: dict | list, headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                if self.path == "/v2/repository/index":
                    self._send(200, [{"name": m, "version": "1", "state": "READY", "reason": ""}
                                     for m in sorted(fake.models)])
                    return
                model = self.path.split("/")[3]
                with fake.lock:
                    fake.hits[model] = fake.hits.get(model, 0) + 1
                    fake.in_flight += 1
                    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.delay)
                    if fake.answer == "503":
                        self._send(503, {"error": "queue full"}, {"Retry-After": "1"})
                    elif fake.answer in ("500", "400", "404"):
                        self._send(int(fake.answer), {"error": f"{fake.name} says {fake.answer}"})
                    else:
                        self._send(200, {"model_name": model, "model_version": "1", "outputs": [
                            {"name": "who", "datatype": "BYTES", "shape": [1], "data": [fake.name]}]})
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # many clients connect at once (socketserver's default backlog is 5)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def box(self) -> Box:
        return Box(name=self.name, addresses=("127.0.0.1",), port=self.server.server_address[1])

    def total(self) -> int:
        return sum(self.hits.values())

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_boxes(*specs: tuple[str, set[str], str]) -> Iterator[list[FakeBox]]:
    boxes = [FakeBox(name, models, answer) for name, models, answer in specs]
    try:
        yield boxes
    finally:
        for box in boxes:
            box.stop()


def dead_box(name: str = "dead") -> Box:
    """A box whose port nothing listens on (connection refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return Box(name=name, addresses=("127.0.0.1",), port=port)
