"""A TCP relay for tests: it listens on 127.0.0.1 and connects onward from another loopback address, so
a client whose own library cannot pick its source address (gRPC) reaches the daemon as that address."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


def _pump(source: socket.socket, target: socket.socket, seen: list[bytes] | None = None) -> None:
    try:
        while data := source.recv(65536):
            if seen is not None:
                seen.append(data)
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def relay(target_port: int, source_address: str, seen: list[bytes] | None = None) -> Iterator[int]:
    """Yield a port on 127.0.0.1 whose connections reach 127.0.0.1:``target_port`` from ``source_address``;
    ``seen`` collects every byte the clients sent (what a box in the middle would see)."""
    listener = socket.create_server(("127.0.0.1", 0))
    sockets: list[socket.socket] = [listener]

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", target_port), source_address=(source_address, 0))
            sockets.extend((client, upstream))
            for a, b, log in ((client, upstream, seen), (upstream, client, None)):
                threading.Thread(target=_pump, args=(a, b, log), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
            with contextlib.suppress(OSError):
                sock.close()
