"""How the appliance scales with cores: the same bench.triton cases with the whole daemon (its model
processes included) pinned to one core and to two with ``taskset``, perf_analyzer sharing the box.

    python -m bench.cores [--cores 1,2] [--repeats 3] [--interval-ms 1000] [--cases identity]
                          [--protocols http,grpc] [--concurrency 1,16]

Per repeat each pinning is started, measured on every case, protocol and concurrency, and stopped, the
order alternating between repeats; each figure is the median over the repeats. Targets (issue 39): c=16
throughput on two cores ≥ 1.5× one core, c=1 p50 on two cores no worse than on one. Writes
bench/results/cores.md and cores.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.process import start_appliance
from bench.report import command_line, publish
from bench.triton import Running, add_run_options, alternate, parse_run_options
from bench.triton_models import write_repository

SCALING_TARGET = 1.5
"""c=16 throughput on the most cores over one core."""


def _pinned(repo: Path, state: Path, cores: int) -> Running:
    server = start_appliance(repo, state, prefix=("taskset", "-c", f"0-{cores - 1}"))
    return Running(f"127.0.0.1:{server.port}", f"127.0.0.1:{server.grpc_port}", server.process.pid, server.stop)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    repo = write_repository(work / "repo")
    servers: dict[str, Callable[[], Running]] = {
        _label(cores): functools.partial(_pinned, repo, work / f"state-{cores}", cores) for cores in args.cores}
    data = alternate(servers, args)
    data["medians"] = {cores: data["medians"][_label(cores)] for cores in args.cores}
    return data


def _label(cores: int) -> str:
    return f"{cores} core{'s' if cores > 1 else ''}"


def table(medians: dict[int, dict[str, list[float]]]) -> str:
    """One row per case, protocol and concurrency: each pinning's throughput, p50 and CPU per request, and
    the most cores over one core, marked against the targets (throughput at c=16, p50 at c=1)."""
    counts = sorted(medians)
    one, most = counts[0], counts[-1]
    head = " | ".join(f"{c} core{'s' if c > 1 else ''}: inf/s, p50 ms, CPU µs/req" for c in counts)
    lines = [f"| case | protocol | c | {head} | × throughput ({most} vs {one}) | × p50 | target |",
             "|---|---|---|" + "---|" * len(counts) + "---|---|---|"]
    for key, base in medians[one].items():
        case, protocol, concurrency = key.split("|")
        top = medians[most].get(key)
        if top is None:
            continue
        cells = " | ".join(f"{medians[c][key][0]:.0f}, {medians[c][key][1]:.3f}, {medians[c][key][2]:.0f}"
                           for c in counts if key in medians[c])
        rate, p50 = top[0] / base[0], top[1] / base[1]
        if int(concurrency) > 1:
            verdict = f"throughput ≥ {SCALING_TARGET}×: {'met' if rate >= SCALING_TARGET else 'MISSED'}"
        else:
            verdict = f"p50 no worse: {'met' if p50 <= 1.0 else 'MISSED'}"
        lines.append(f"| {case} | {protocol} | {concurrency} | {cells} | {rate:.2f} | {p50:.2f} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=lambda t: sorted(int(c) for c in t.split(",")), default=[1, 2])
    add_run_options(parser, ["identity"])
    args = parse_run_options(parser, argv)
    available = len(os.sched_getaffinity(0))
    if args.cores[0] < 1 or args.cores[-1] > available:
        parser.error(f"--cores must lie between 1 and this box's {available} usable cores")
    from tests.oracle import TritonUnavailable

    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cores-") as tmp:
            data = measure(args, Path(tmp))
    except TritonUnavailable as error:  # perf_analyzer comes with real Triton's client wheel
        print(f"perf_analyzer is unavailable here, nothing measured: {error}", file=sys.stderr)
        return 1
    load = data["load_average"]
    command = command_line("bench.cores", argv)
    text = (f"Command: {command} ({time.monotonic() - started:.0f} s)\n\n"
            f"Machine: {data['machine']}; 1-minute load average {load['median']:.2f} (median; "
            f"{load['min']:.2f}-{load['max']:.2f}). Medians of {args.repeats} repeats, pinnings alternated; "
            "the daemon and its model processes pinned with taskset, perf_analyzer 2.51 unpinned on the same "
            "box; CPU per request of the daemon's whole process tree.\n\n" + table(data["medians"]))
    publish(text, args.out, "cores.md")
    (args.out / "cores.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
