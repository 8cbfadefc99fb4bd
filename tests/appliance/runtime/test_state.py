"""The state dir check: writable by trying, problems recorded once with their fixes."""

from __future__ import annotations

import json
import subprocess
import sys

from appliance.runtime.state import StateDir
from tests.readonly import read_only_prefix, unwritable


def test_a_writable_dir_is_created_and_left_as_it_was(tmp_path):
    state = StateDir.check(tmp_path / "new" / "state")
    assert state.writable and state.reason is None and not state.degraded
    assert list((tmp_path / "new" / "state").iterdir()) == []  # the probe file is gone
    assert state.to_json() == {"path": str(tmp_path / "new" / "state"), "writable": True, "reason": None,
                               "problems": []}


def test_a_dir_that_cannot_be_created_is_not_writable(tmp_path, caplog):
    state = StateDir.check(unwritable(tmp_path))
    assert not state.writable and state.reason == "Not a directory"
    (problem,) = state.problems
    assert problem.kind == "read_only" and "not writable" in problem.message and "writable" in problem.fix
    assert "To fix:" in caplog.text


def test_a_read_only_mount_is_not_writable(tmp_path):
    """Mode bits would say writable (root); only trying tells."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    script = ("import json, sys; from pathlib import Path; from appliance.runtime.state import StateDir; "
              "print(json.dumps(StateDir.check(Path(sys.argv[1])).to_json()))")
    result = subprocess.run([*read_only_prefix(state_dir), sys.executable, "-c", script, str(state_dir)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["writable"] is False and report["reason"] == "Read-only file system"
    assert [p["kind"] for p in report["problems"]] == ["read_only"]


def test_problems_are_recorded_once_and_bounded(tmp_path):
    state = StateDir(tmp_path)
    for _ in range(3):
        state.note("cache_not_saved", "model m is not cached", "free disk space")
    assert len(state.problems) == 1 and state.degraded
    for i in range(200):
        state.note("cache_entry_unreadable", f"entry {i}", "clear the cache")
    assert len(state.problems) == 100
    assert "100 problem(s): cache_not_saved, cache_entry_unreadable" in state.summary()


def test_losing_write_access_while_running_is_reported_once(tmp_path):
    state = StateDir.check(tmp_path)
    assert state.writable and not state.degraded
    state.lost_write_access("attempt to write a readonly database")
    state.lost_write_access("attempt to write a readonly database")
    assert not state.writable and state.reason == "attempt to write a readonly database"
    assert [p.kind for p in state.problems] == ["read_only"]
    assert state.to_json()["writable"] is False
