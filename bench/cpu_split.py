"""Where each server's CPU goes per request, process by process: the server itself and each of its
model processes (Triton's stubs, the appliance's model processes), user and system time apart, and
context switches (wake-ups) per request.

    python -m bench.cpu_split [--cases identity] [--protocol http] [--concurrency 1]
                              [--servers triton,appliance,in-process] [--repeats 2] [--interval-ms 2000]

bench.triton gives each server's whole process tree; this splits it, to see whether a gap is in the front
end, in the model processes or in the kernel (system time: sends, receives, waking the other side).
Same repository and perf_analyzer runs as bench.triton (real Triton from the cache outside the
repository); servers one at a time. Only processes that spent at least 1 µs a request are listed.
Writes bench/results/cpu-split.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import command_line
from bench.serving import RESULTS, machine
from bench.triton import (
    CASES,
    TICKS_PER_SECOND,
    Running,
    _start_appliance,
    _start_triton,
    perf_once,
    process_tree,
)
from bench.triton_models import write_repository

SERVERS = ("triton", "appliance", "in-process")

Sample = dict[int, tuple[str, int, int, int]]
"""Per process of a tree: (what it is, user ticks, system ticks, context switches)."""


def _label(pid: int) -> str:
    words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    if "appliance.backends.python.model_process.stub" in words and len(words) >= 3:  # ... MODEL_FILE DAEMON_PID
        return "model process " + Path(words[-2]).parent.parent.name
    if words and words[0].endswith("triton_python_backend_stub") and len(words) >= 2:  # ... INSTANCE KIND
        return "stub " + words[-2]
    return "server"


def sample(pid: int) -> Sample:
    """Every process below ``pid`` (itself included): CPU ticks and context switches, all threads."""
    out: Sample = {}
    for process, fields, tasks in process_tree(pid):
        switches = 0
        for task in tasks:
            try:
                status = Path(f"/proc/{process}/task/{task}/status").read_text()
            except OSError:  # a thread that ended meanwhile: the process is still counted
                continue
            for line in status.splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        try:
            out[process] = (_label(process), int(fields[11]), int(fields[12]), switches)
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
    return out


def split(before: Sample, after: Sample, requests: int) -> list[tuple[str, float, float, float]]:
    """Per process alive in both samples: (what, user µs, system µs, context switches) per request."""
    rows = []
    for pid, (label, user, system, switches) in after.items():
        if pid not in before or not requests:
            continue
        _, user0, system0, switches0 = before[pid]
        row = (label, (user - user0) / TICKS_PER_SECOND / requests * 1e6,
               (system - system0) / TICKS_PER_SECOND / requests * 1e6,
               (switches - switches0) / requests)
        if row[1] + row[2] >= 1:
            rows.append(row)
    return sorted(rows, key=lambda r: (r[0] != "server", r[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=lambda t: t.split(","), default=["identity"], help=",".join(CASES))
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--servers", type=lambda t: t.split(","), default=list(SERVERS), help=",".join(SERVERS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES] + [s for s in args.servers if s not in SERVERS]
    if unknown:
        parser.error(f"unknown {unknown}; cases: {','.join(CASES)}; servers: {','.join(SERVERS)}")
    from tests.oracle import TritonUnavailable

    started = time.monotonic()
    lines = ["| server | case | inf/s | p50 ms | process | user µs/req | system µs/req | context switches/req |",
             "|---|---|---|---|---|---|---|---|"]
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-split-") as tmp:
        work = Path(tmp)
        repo, trusted = write_repository(work / "repo"), write_repository(work / "repo-trusted", trusted=True)
        starters: dict[str, Callable[[], Running]] = {
            "triton": lambda: _start_triton(repo, work / "triton"),
            "appliance": lambda: _start_appliance(repo, work / "appliance"),
            "in-process": lambda: _start_appliance(trusted, work / "in-process"),
        }
        for name in args.servers:
            try:
                running = starters[name]()
            except TritonUnavailable as error:
                print(f"real Triton is unavailable here, left out: {error}", file=sys.stderr)
                continue
            try:
                for key in args.cases:
                    case = CASES[key]
                    url = running.grpc if args.protocol == "grpc" else running.http
                    perf_once(case, url, args.protocol, 2, 500)  # warm-up
                    for _ in range(args.repeats):
                        served, before = running.successes(case.model), sample(running.pid)
                        result = perf_once(case, url, args.protocol, args.concurrency, args.interval_ms)
                        served = running.successes(case.model) - served
                        after = sample(running.pid)
                        loads.append(os.getloadavg()[0])
                        for label, user, system, switches in split(before, after, served):
                            lines.append(f"| {name} | {case.name} | {result.best.throughput:.0f} | "
                                         f"{result.best.p50_us / 1000:.3f} | {label} | {user:.0f} | {system:.0f} | "
                                         f"{switches:.2f} |")
                            print(lines[-1], file=sys.stderr, flush=True)
            finally:
                running.stop()
    command = command_line("bench.cpu_split", argv)
    text = (f"Command: {command} ({time.monotonic() - started:.0f} s)\n\nMachine: {machine()}; 1-minute load "
            f"average {min(loads, default=0):.2f}-{max(loads, default=0):.2f}. {args.protocol}, c={args.concurrency}; "
            f"one row per process and run (perf_analyzer windows of {args.interval_ms} ms).\n\n"
            + "\n".join(lines) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu-split.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
