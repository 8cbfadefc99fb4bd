"""bench.workers: the CPU split over the daemon's tree, and the table against the daemon alone."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.workers import cpu_by_part, table
from tests.waiting import wait_until


def test_the_cpu_of_a_tree_is_split_between_the_daemon_its_workers_and_the_rest():
    sum(range(3_000_000))  # some CPU of this process's own
    child = subprocess.Popen([sys.executable, "-c", "import time; sum(range(5_000_000)); time.sleep(30)"])
    try:
        parts = wait_until(lambda: (found := cpu_by_part(os.getpid()))["models"] > 0 and found, timeout=20,
                           what="the child's CPU counted")
        assert parts["daemon"] > 0 and parts["workers"] == 0.0  # the child's command names no worker
    finally:
        child.kill()
        child.wait()


def test_the_table_gives_each_setting_over_the_daemon_alone():
    medians = {0: {16: [2000.0, 6.0, 300.0, 0.0, 80.0]}, 2: {16: [2400.0, 5.0, 240.0, 90.0, 80.0]}}
    rows = table(medians).splitlines()[2:]
    assert rows[0] == "| 0 | 16 | 2000 | 6.000 | 300 | 0 | 80 | 380 | 1.00 | 1.00 |"
    assert rows[1] == "| 2 | 16 | 2400 | 5.000 | 240 | 90 | 80 | 410 | 1.20 | 0.80 |"
