"""bench.lean's own pieces: the table's ratio is the median of each round's appliance/reference CPU, marked
against the 1.5× target, and the CPU of a tree is split into the server process and those below it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from bench.lean import VARIED, Round, _body, table, tree_split, varied_lua
from tests.waiting import wait_until


def _round(rate: float, server: float, model: float, load: float = 1.0) -> Round:
    return Round(rate, 0.5, server, model, 0, load)


def test_the_ratio_is_the_median_of_each_rounds_ratio_against_the_target():
    rounds = {("appliance", 1): [_round(2000, 250, 50), _round(1900, 150, 50), _round(2100, 120, 40)],
              ("reference", 1): [_round(4000, 80, 20), _round(4100, 130, 30), _round(3900, 100, 30)],
              ("appliance", 16): [_round(5000, 40, 10)], ("reference", 16): [_round(9000, 25, 10)]}
    lines = table(rounds).splitlines()
    assert lines[0].startswith("| c | server | req/s |")
    # c=1: per-round ratios 3.0, 1.25, 1.23 -> 1.25, met (the ratio of the medians, 200/130, would miss)
    assert lines[2] == "| 1 | appliance | 2000 | 0.500 | 200 (150 + 50) | 1.25 | met | 0 | 1.00 |"
    assert lines[3] == "| 1 | reference | 4000 | 0.500 | 130 (100 + 30) |  |  | 0 | 1.00 |"
    assert lines[4].startswith("| 16 | appliance | 5000 | 0.500 | 50 (40 + 10) | 1.43 | met |")
    rounds[("appliance", 16)] = [_round(5000, 43, 10)]  # 53 / 35 = 1.51
    assert table(rounds).splitlines()[4].split(" | ")[5:7] == ["1.51", "MISSED"]


def test_with_triton_every_server_is_set_against_its_cpu_too():
    rounds = {("appliance", 1): [_round(2000, 250, 50), _round(2000, 200, 40)],
              ("reference", 1): [_round(4000, 80, 20), _round(4000, 100, 20)],
              ("triton", 1): [_round(3000, 100, 50), _round(3000, 80, 40)]}
    lines = table(rounds).splitlines()
    assert "| × Triton CPU |" in lines[0] and lines[1].count("|") == lines[0].count("|")
    # × reference: 300/100, 240/120 -> 2.50; × Triton: 300/150, 240/120 -> 2.00; the reference 0.83
    assert lines[2] == "| 1 | appliance | 2000 | 0.500 | 270 (225 + 45) | 2.50 | MISSED | 2.00 | 0 | 1.00 |"
    assert lines[3] == "| 1 | reference | 4000 | 0.500 | 110 (90 + 20) |  |  | 0.83 | 0 | 1.00 |"
    assert lines[4] == "| 1 | triton | 3000 | 0.500 | 135 (90 + 45) |  |  | | 0 | 1.00 |"
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_the_varied_bodies_are_one_request_written_at_six_lengths():
    data = [float(v) for v in range(16)]
    assert _body() == json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                              "data": data}]}).encode()
    assert len({len(body) for body in VARIED}) == len(VARIED) == 6
    assert all(json.loads(body)["inputs"][0]["data"] == data for body in VARIED)
    script = varied_lua()
    assert all(body.decode() in script for body in VARIED) and "request = function()" in script


def test_the_split_puts_a_child_below_the_server():
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ninput()\n"
    own, below = tree_split(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE)
    try:
        with contextlib.suppress(AssertionError):  # judged just below
            wait_until(lambda: tree_split(os.getpid())[1] - below >= 0.25, timeout=30, interval=0.05)
        own_after, below_after = tree_split(os.getpid())
        assert below_after - below >= 0.25 and own_after - own < 0.25
    finally:
        child.communicate(b"\n", timeout=30)
