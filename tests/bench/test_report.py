"""The report helpers every benchmark ends with (bench.report)."""

from __future__ import annotations

import re
import sys
import time

from bench.report import command_line, heading, publish


def test_the_command_line_is_the_module_and_its_arguments(monkeypatch):
    assert command_line("bench.lean", ["--seconds", "5"]) == "python -m bench.lean --seconds 5"
    assert command_line("bench.lean", []) == "python -m bench.lean"
    monkeypatch.setattr(sys, "argv", ["lean.py", "--repeats", "3"])
    assert command_line("bench.lean", None) == "python -m bench.lean --repeats 3"


def test_a_report_is_printed_and_written_with_a_final_newline(tmp_path, capsys):
    out = tmp_path / "results" / "deeper"
    publish("| a | b |\n|---|---|", out, "x.md")
    assert (out / "x.md").read_text() == "| a | b |\n|---|---|\n"
    assert capsys.readouterr().out == "| a | b |\n|---|---|\n"
    publish("again", out, "x.md")  # the folder exists: written over
    assert (out / "x.md").read_text() == "again\n"


def test_the_heading_says_how_when_where_and_under_what_load():
    text = heading("bench.layers", ["--repeats", "2"], time.monotonic() - 3, 1.25, [0.5, 2.0, 1.0])
    command, blank, machine = text.split("\n")
    assert blank == ""
    assert re.fullmatch(r"Command: python -m bench\.layers --repeats 2 \([34] s\), commit \S+, \d{4}-\d\d-\d\d",
                        command), command
    assert machine.startswith("Machine: ") and machine.endswith(
        "; 1-minute load average 1.25 before the run, 0.50-2.00 over the rounds."), machine
