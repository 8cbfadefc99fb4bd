"""bench.cores' table: each pinning's figures, the scaling ratio, and the verdict against its target."""

from __future__ import annotations

from bench.cores import table


def test_the_table_marks_scaling_at_c16_and_latency_at_c1():
    medians = {1: {"identity|http|16": [1000.0, 10.0, 300.0, 1.0], "identity|http|1": [500.0, 2.0, 400.0, 1.0]},
               2: {"identity|http|16": [1400.0, 7.0, 320.0, 1.0], "identity|http|1": [520.0, 1.9, 410.0, 1.0]}}
    rows = {line.split(" | ")[2]: line for line in table(medians).splitlines()[2:]}
    assert "| 1.40 | 0.70 | throughput ≥ 1.5×: MISSED |" in rows["16"]
    assert "| 1.04 | 0.95 | p50 no worse: met |" in rows["1"]
    assert "1000, 10.000, 300 | 1400, 7.000, 320" in rows["16"]

