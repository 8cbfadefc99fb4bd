"""What the tests read about the daemon's process from /proc."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["child_pids", "rss_mib"]


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (every thread's)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found
