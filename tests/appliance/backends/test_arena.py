"""Shared-memory arenas between the daemon and Python model processes."""

from __future__ import annotations

import os
import subprocess
import sys

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
