"""One daemon per state directory: the lock, its message and its release."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from appliance.core.errors import ConfigError
from appliance.runtime.state_lock import GRACE_SECONDS, LOCK_NAME, StateLock
from tests.readonly import unwritable


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    first = StateLock.acquire(tmp_path)
    assert first is not None
    try:
        with pytest.raises(ConfigError, match=rf"another appliance daemon \(PID {os.getpid()}\) is serving from "
                                              rf"the state dir .*--state-dir"):
            StateLock.acquire(tmp_path)
    finally:
        first.release()
    again = StateLock.acquire(tmp_path)  # released: the next daemon takes it
    assert again is not None
    again.release()
    again.release()  # idempotent


def test_a_dead_holder_leaves_no_stale_lock(tmp_path):
    """The kernel drops a flock with its process: a crashed daemon never blocks the next start."""
    script = ("import sys; from pathlib import Path; from appliance.runtime.state_lock import StateLock; "
              "assert StateLock.acquire(Path(sys.argv[1])) is not None; import os; os._exit(0)")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    assert (tmp_path / LOCK_NAME).read_text().strip().isdigit()
    lock = StateLock.acquire(tmp_path)
    assert lock is not None
    lock.release()


def test_the_lock_is_not_inherited_by_children(tmp_path):
    lock = StateLock.acquire(tmp_path)
    assert lock is not None
    try:
        script = ("import sys; from pathlib import Path; from appliance.runtime.state_lock import StateLock; "
                  "from appliance.core.errors import ConfigError\n"
                  "try:\n    StateLock.acquire(Path(sys.argv[1]))\nexcept ConfigError:\n    print('refused')")
        result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                                timeout=60, check=True)
        assert result.stdout.strip() == "refused"
    finally:
        lock.release()


def test_a_directory_that_cannot_hold_a_lock_file_is_not_locked(tmp_path):
    assert StateLock.acquire(unwritable(tmp_path)) is None


def test_a_copy_held_by_a_child_between_fork_and_exec_only_delays_the_next_start(tmp_path):
    """A daemon that stops while a thread of it is starting a child: the child holds the lock's descriptor
    until its exec closes it. The next start waits for that, and does not refuse."""
    lock = StateLock.acquire(tmp_path)
    assert lock is not None
    pid = os.fork()
    if pid == 0:  # the child between fork and exec: it holds the copy for a moment, then goes
        time.sleep(GRACE_SECONDS / 10)
        os._exit(0)
    try:
        lock.release()  # the daemon has stopped; only the child's copy holds the lock now
        again = StateLock.acquire(tmp_path)  # (refused with ConfigError, before the grace)
        assert again is not None
        again.release()
    finally:
        os.waitpid(pid, 0)


def test_a_holder_that_stays_past_the_grace_is_refused(tmp_path):
    lock = StateLock.acquire(tmp_path)
    assert lock is not None
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError, match="another appliance daemon"):
            StateLock.acquire(tmp_path)
        assert time.monotonic() - started >= GRACE_SECONDS
    finally:
        lock.release()
