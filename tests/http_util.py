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



def _tcp_sockets() -> Iterator[tuple[int, int, str, int, int]]:
    """Each TCP socket of this network namespace as (local port, remote port, state, tx_queue, rx_queue), from
    Linux's /proc/net/tcp and tcp6 (state 0A: listening; a listener's rx_queue is its accept queue)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)  # the header
                for row in rows:
                    fields = row.split()
                    tx_queue, rx_queue = (int(part, 16) for part in fields[4].split(":"))
                    yield (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3],
                           tx_queue, rx_queue)
        except FileNotFoundError:
            pass


def accept_queue(port: int) -> int:
    """Connections to ``port`` that the kernel completed and its listener has not accepted yet, over every
    socket listening on it."""
    return sum(rx for local, _, state, _, rx in _tcp_sockets() if local == port and state == "0A")


def unread(sock: socket.socket) -> int:
    """Bytes ``sock`` (connected over loopback) sent that the application at the other end has not read yet:
    still in this socket's send queue or in the peer's receive queue."""
    mine, theirs = sock.getsockname()[1], sock.getpeername()[1]
    unsent = sum(tx for local, remote, _, tx, _ in _tcp_sockets() if (local, remote) == (mine, theirs))
    return unsent + sum(rx for local, remote, _, _, rx in _tcp_sockets() if (local, remote) == (theirs, mine))
