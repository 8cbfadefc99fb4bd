"""The tests' /proc readers."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.processes import running
from tests.waiting import wait_until


def test_running_is_true_for_a_live_process_and_false_once_it_ended_reaped_or_not():
    assert running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: not running(child.pid), timeout=10)  # a zombie until reaped: ended all the same
    child.wait()
    assert not running(child.pid)
