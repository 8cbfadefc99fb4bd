"""The state directory's health: whether the daemon can write there, and what it found wrong.

Edge filesystems remount read-only after errors, and files in the state dir (the metrics database,
cache entries) can be damaged by power loss. Neither may stop the appliance from serving inference:
the daemon checks once at start whether the directory is writable (by writing, not by reading mode
bits, which say nothing about a read-only mount or a root-owned process), keeps serving from what is
readable, and records every problem here. The record is reported in the log (each problem as a
warning with its fix), by ``GET /v2/health`` and on the dashboard.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["Problem", "StateDir"]

log = logging.getLogger(__name__)

# Problems are reported per thing (a cache entry, a model); a bound keeps a sick box's answer small.
_MAX_PROBLEMS = 100


@dataclasses.dataclass(frozen=True)
class Problem:
    kind: str
    """A stable name: read_only, metrics_db_corrupt, metrics_db_unusable, cache_entry_unreadable,
    cache_not_saved, token_not_saved, example_repository_temporary, device_id_not_saved."""
    message: str
    """What is wrong and what the daemon does instead."""
    fix: str
    """What a person can do about it."""


class StateDir:
    """Whether ``path`` is writable, and the problems found in it. Thread-safe: models load on threads."""

    def __init__(self, path: Path, writable: bool = True, reason: str | None = None) -> None:
        self.path = path
        self.writable = writable
        self.reason = reason
        """Why the directory is not writable (None when it is)."""
        self._problems: list[Problem] = []
        self._lock = threading.Lock()

    @classmethod
    def check(cls, path: Path) -> StateDir:
        """Create ``path`` if needed and write, sync and remove a file in it (blocking)."""
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
            try:
                os.write(fd, b"ok\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            state = cls(path, writable=False, reason=reason)
            state.note(
                "read_only",
                f"the state dir {path} is not writable: {reason}; serving from what is readable and writing "
                f"nothing there: no metrics history, no trace files (traces stay in memory), no new model cache "
                f"entries (models are measured again on every start), no new token, example repository or device id",
                f"make {path} writable (a filesystem remounted read-only after errors: check `dmesg`, repair it "
                f"with fsck, remount it read-write) or point --state-dir / APPLIANCE_STATE_DIR at a writable "
                f"directory, then restart the daemon",
            )
            return state
        return cls(path)

    def lost_write_access(self, reason: str) -> None:
        """The directory stopped taking writes while running (a filesystem remounted read-only)."""
        with self._lock:
            was_writable, self.writable, self.reason = self.writable, False, reason
        if was_writable:
            self.note(
                "read_only",
                f"the state dir {self.path} stopped taking writes while running ({reason}); serving goes on, "
                f"metrics history and new model cache entries stop",
                f"make {self.path} writable again (check `dmesg`, repair the filesystem with fsck, remount it "
                f"read-write), then restart the daemon",
            )

    def note(self, kind: str, message: str, fix: str) -> None:
        """Record a problem and log it as a warning with its fix (once per distinct problem)."""
        problem = Problem(kind, message, fix)
        with self._lock:
            if problem in self._problems or len(self._problems) >= _MAX_PROBLEMS:
                return
            self._problems.append(problem)
        log.warning("state dir: %s. To fix: %s", message, fix)

    @property
    def problems(self) -> list[Problem]:
        with self._lock:
            return list(self._problems)

    @property
    def degraded(self) -> bool:
        return not self.writable or bool(self.problems)

    def summary(self) -> str:
        """One line for the log: what is degraded, where to read the details."""
        problems = self.problems
        kinds = ", ".join(dict.fromkeys(p.kind for p in problems))
        return (f"running with a degraded state dir {self.path} ({len(problems)} problem(s): {kinds}); "
                f"details and fixes at GET /v2/health and on the dashboard")

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "writable": self.writable,
            "reason": self.reason,
            "problems": [dataclasses.asdict(p) for p in self.problems],
        }
