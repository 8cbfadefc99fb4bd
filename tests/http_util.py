"""Raw HTTP and socket helpers for tests that must send what no well-behaved client sends."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any


def call(port: int, method: str, path: str, body: bytes | str | dict | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30,
         source: str | None = None) -> tuple[int, dict[str, str], Any]:
    """Returns (status, headers, JSON body or raw bytes); ``source`` picks the client's own address
    (another loopback address such as 127.0.0.2 looks remote to a daemon told so)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                            source_address=(source, 0) if source else None)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        try:
            payload: Any = json.loads(raw) if raw else None
        except ValueError:
            payload = raw
        return response.status, dict(response.getheaders()), payload
    finally:
        connection.close()


@contextlib.contextmanager
def open_sockets() -> Iterator[list[socket.socket]]:
    """A list to put the sockets a test opens in (floods, slow clients); each is closed at the end."""
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()
