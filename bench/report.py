"""What a benchmark does with its figures once measured: the report's heading (the command line, the
commit, the machine and its load) and the report printed and written under bench/results/."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.serving import machine

__all__ = ["command_line", "commit", "heading", "publish"]


def command_line(module: str, argv: list[str] | None) -> str:
    """How ``module`` was run (``python -m bench.lean --seconds 5``): ``argv``, or this process's arguments."""
    return " ".join([f"python -m {module}", *(argv if argv is not None else sys.argv[1:])])


def commit() -> str:
    """The checkout's commit, short ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def heading(module: str, argv: list[str] | None, started: float, before: float, loads: Sequence[float]) -> str:
    """A report's first lines: how it was run, for how long (``started``: ``time.monotonic()`` at the start),
    the commit and the day; the machine, and its 1-minute load average ``before`` the run and over its rounds
    (``loads``), the figures' noise."""
    return (f"Command: {command_line(module, argv)} ({time.monotonic() - started:.0f} s), commit {commit()}, "
            f"{time.strftime('%Y-%m-%d')}\n\n"
            f"Machine: {machine()}; 1-minute load average {before:.2f} before the run, "
            f"{min(loads):.2f}-{max(loads):.2f} over the rounds.")


def publish(text: str, out: Path, name: str) -> None:
    """Print the report and write it to ``out/name`` (``out`` made if missing), ending in a newline."""
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text + "\n")
