"""The child processes backends start (Python model processes), as the daemon ends them at stop.

A backend registers each process it starts and unregisters it once it has ended it itself. What is
still registered when the daemon stops belongs to an instance that could not close (its thread stuck in
execute(), or a load stuck in initialize()): ``stop`` asks each such process to finish, waits up to
``exit_timeout`` (Triton's --exit-timeout-secs), then kills what is left, so that the daemon exits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

__all__ = ["ChildProcess", "ChildProcesses"]

log = logging.getLogger(__name__)


class ChildProcess(Protocol):
    name: str

    @property
    def pid(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def request_stop(self) -> None:
        """Ask the process to finish what it is doing and exit (never blocks)."""

    def kill(self) -> None: ...


class ChildProcesses:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: set[ChildProcess] = set()

    def register(self, child: ChildProcess) -> None:
        with self._lock:
            self._children.add(child)

    def unregister(self, child: ChildProcess) -> None:
        with self._lock:
            self._children.discard(child)

    def pids(self) -> set[int]:
        """The process ids of every registered child (alive or not: what a dead one left counts too)."""
        with self._lock:
            return {child.pid for child in self._children}

    def pids_of(self, name: str) -> set[int]:
        """The process ids of model ``name``'s registered processes."""
        with self._lock:
            return {child.pid for child in self._children if child.name == name}

    def alive(self) -> list[ChildProcess]:
        with self._lock:
            return [child for child in self._children if child.alive]

    def stop(self, exit_timeout: float) -> list[str]:
        """Blocking: ask every registered process to stop, wait up to ``exit_timeout`` seconds, kill the
        rest; the names of those killed."""
        left = self.alive()
        for child in left:
            child.request_stop()
        deadline = time.monotonic() + exit_timeout
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [child for child in left if child.alive]
        for child in left:
            log.warning("the process of model %s did not finish within exit_timeout (%.0f s); killing it",
                        child.name, exit_timeout)
            child.kill()
        with self._lock:
            self._children.clear()
        return [child.name for child in left]
