"""Shared-memory arenas between the daemon and Python model processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from appliance.backends.python.arena import ARENA_PREFIX, Arena, remove_stale_arenas


def test_arenas_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / f"{ARENA_PREFIX}{dead}-abc").write_bytes(b"x")
    (tmp_path / f"{ARENA_PREFIX}{os.getpid()}-def").write_bytes(b"x")  # ours: alive
    (tmp_path / f"{ARENA_PREFIX}oldstyle").write_bytes(b"x")  # no owner to check: kept
    (tmp_path / "other").write_bytes(b"x")
    assert remove_stale_arenas(str(tmp_path)) == [f"{ARENA_PREFIX}{dead}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{ARENA_PREFIX}{os.getpid()}-def", f"{ARENA_PREFIX}oldstyle", "other"])


def test_an_arena_names_its_creator():
    arena = Arena.create(1024)
    try:
        assert os.path.basename(arena.path).startswith(f"{ARENA_PREFIX}{os.getpid()}-")
    finally:
        arena.close()


def test_arenas_of_exited_but_unreaped_processes_are_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited, not yet waited for: a zombie
        if Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
            break
        time.sleep(0.01)
    (tmp_path / f"{ARENA_PREFIX}{child.pid}-abc").write_bytes(b"x")
    try:
        assert remove_stale_arenas(str(tmp_path)) == [f"{ARENA_PREFIX}{child.pid}-abc"]
    finally:
        child.wait()
