"""bench.instructions' own pieces: the dumps it counts (a dump per process, the files written at exit left
out, the server's own apart from those below it) and its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.settings import load_settings
from bench.instructions import Count, count_dumps, median_count, quiet_setup, table
from bench.lean import _MODEL


def _dump(path, instructions: int) -> None:
    path.write_bytes(b"# callgrind format\nversion: 1\ncreator: callgrind-3.22.0\ncmd: python\npart: 1\n"
                     b"events: Ir\nfn=main\n0 5\nsummary: %d\ntotals: %d\n" % (instructions, instructions))


def test_the_dumps_are_split_between_the_server_and_the_processes_below_it(tmp_path):
    _dump(tmp_path / "cg.100.1", 5_000_000)
    _dump(tmp_path / "cg.200.1", 1_000_000)
    _dump(tmp_path / "cg.201.1", 500_000)
    _dump(tmp_path / "cg.100", 9_999_999)  # written at exit, after the count: left out
    (tmp_path / "reference.log").write_text("serving")
    count = count_dumps(tmp_path, 100, 500)
    assert count == Count(10_000.0, 3_000.0) and count.total == 13_000.0


def test_a_file_that_is_no_dump_is_refused(tmp_path):
    (tmp_path / "cg.100.1").write_bytes(b"not callgrind")
    with pytest.raises(ValueError, match="no callgrind summary"):
        count_dumps(tmp_path, 100, 1)


def test_the_table_gives_each_tree_against_the_reference():
    lines = table({"reference": Count(250_000, 125_000), "appliance": Count(500_000, 130_000)}).splitlines()
    assert lines[2] == "| reference | 375.0 k (250.0 k + 125.0 k) |  |"
    assert lines[3] == "| appliance | 630.0 k (500.0 k + 130.0 k) | 1.680 |"


def test_the_median_run_is_the_middle_total_and_an_even_count_takes_the_lower():
    runs = [Count(500_000, 130_000), Count(470_000, 130_000), Count(490_000, 133_000)]
    assert median_count(runs) == Count(490_000, 133_000)
    assert median_count(runs[:2]) == Count(470_000, 130_000)


def test_the_table_can_compare_against_the_baseline():
    lines = table({"appliance": Count(470_000, 134_000), "baseline": Count(547_000, 134_000)},
                  reference="baseline").splitlines()
    assert lines[0].endswith("× baseline |") and lines[2].endswith("| 0.887 |")


def test_the_appliance_counted_ticks_its_metrics_once_an_hour(tmp_path):
    repo, env = quiet_setup(tmp_path)
    settings = load_settings(env={}, config_file=Path(env["APPLIANCE_CONFIG"]))
    assert settings.metrics.interval == 3600  # clock-driven work, stretched by valgrind, not counted
    assert settings.auth.protect_inference  # bench.lean's production settings kept
    assert [model.name for model in repo.iterdir()] == [_MODEL]
