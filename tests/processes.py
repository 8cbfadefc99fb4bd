"""What the tests read about the daemon's process from /proc."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["child_pids", "rss_mib", "running"]


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (every thread's)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and has not ended (a zombie its parent has not reaped yet
    has ended; so has a process reaped between two looks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")  # the state, after "pid (comm)"
