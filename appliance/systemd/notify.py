"""sd_notify over $NOTIFY_SOCKET (a few lines; no libsystemd needed).

READY=1 once the port is bound and the repository loaded, STATUS= with models ready/tuning, WATCHDOG=1
at half of WATCHDOG_USEC from the event loop (so a stuck loop misses its pings and systemd restarts the
daemon), RELOADING=1 / READY=1 around a SIGHUP re-scan, STOPPING=1 on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, socket_path: str | None, watchdog_usec: int | None = None) -> None:
        self._address = None
        if socket_path:
            # "@name" is an abstract socket: its address starts with a NUL byte.
            self._address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None
        self._socket: socket.socket | None = None
        self._pending: list[bytes] = []
        """State messages (READY, STOPPING...) the full socket refused: sent again before the next one."""

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *lines: str) -> None:
        if self._address is None:
            return
        message = "\n".join(lines).encode()
        if self._socket is None:
            # Non-blocking: a receiver that does not read must never stall the event loop.
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.setblocking(False)
        for queued in [*self._pending, message]:
            try:
                self._socket.sendto(queued, self._address)
            except BlockingIOError:
                if queued == message and not message.startswith(b"WATCHDOG=1"):
                    self._pending.append(message)  # a state change must arrive; a ping may be lost
                log.warning("sd_notify: the notify socket is full; will retry state messages")
                return
            except OSError as exc:  # systemd gone or socket misconfigured: never fatal
                log.warning("sd_notify failed: %s", exc)
                return
            if queued is not message:
                self._pending.remove(queued)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping: finishing in-flight requests")

    async def watchdog(self) -> None:
        """Ping from the event loop itself: if the loop stalls, the pings stop."""
        if self.watchdog_interval is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
