"""bench.cpu_split's accounting: per process of a tree, per request, what /proc says."""

from __future__ import annotations

import os

from bench.cpu_split import sample, split
from bench.triton import TICKS_PER_SECOND as _TICK


def test_the_sample_covers_the_process_and_its_threads():
    mine = sample(os.getpid())[os.getpid()]
    assert mine[0] == "server" and mine[1] >= 0 and mine[3] > 0  # a running test has been switched out


def test_the_split_is_per_request_and_leaves_out_idle_and_gone_processes():
    before = {1: ("server", 100, 50, 10), 2: ("model process m", 20, 10, 5), 3: ("stub x", 0, 0, 0)}
    after = {1: ("server", 100 + _TICK, 50 + _TICK // 2, 1010), 2: ("model process m", 20, 10, 5),
             4: ("model process new", 9, 9, 9)}
    rows = split(before, after, requests=1000)
    assert rows == [("server", 1000.0, (_TICK // 2) / _TICK * 1000, 1.0)]  # µs per request, switches per request
    assert split(before, after, requests=0) == []
