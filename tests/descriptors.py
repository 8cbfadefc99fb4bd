"""What a process holds open, for tests that check a resource was given back (Linux /proc)."""

from __future__ import annotations

import os
from pathlib import Path


def open_paths(pid: int | str = "self") -> list[str]:
    """The paths a process's file descriptors point to."""
    targets = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.append(os.readlink(entry))
        except OSError:
            pass  # closed while listing
    return targets


def opened(pid: int | str, key: str) -> int:
    """How many descriptors of the process point to the shared-memory object ``key`` ('/name')."""
    path = f"/dev/shm{key}"
    return sum(target in (path, f"{path} (deleted)") for target in open_paths(pid))
