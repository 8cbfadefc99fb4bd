"""An A/B of a change on bench.triton's cases: the appliance from another checkout against this tree,
both running at once and measured in turn, window after window.

    python -m bench.ab --baseline CHECKOUT [--cases identity,batching] [--protocols http,grpc]
                       [--concurrency 1,16] [--rounds 8] [--interval-ms 1000] [--in-process]
                       [--args "--flag value"] [--baseline-args "..."] [--client h2load]

A shared box's load drifts over minutes, which swamps a change of 10-20 % when each server is measured
for minutes on end (bench.triton). Here both daemons serve the same repository (bench/triton_models.py)
the whole time, and each round measures the baseline then this tree (the order flips every round) with
one short perf_analyzer run each; the figures are medians over rounds, and the ratio column is the median
of each round's own ratio (this tree over the baseline, measured seconds apart). CPU per request is the
daemon's whole process tree (its model processes included), from /proc around each run. The idle
daemon costs nothing while the other is measured. Make the baseline with ``git archive <commit> | tar -x
-C DIR``. Writes bench/results/ab.md (``--out`` elsewhere).

``--client h2load`` drives the gRPC rows with nghttp2's h2load instead (HTTP/2 POSTs of one ModelInferRequest
of FP32[1,16], one call in flight a connection, as bench.serving's gRPC series): a client that sends some
headers as literals without indexing, where perf_analyzer's grpc client indexes them all. The cases whose
model takes INPUT0 alone (identity, batching, bls, ensemble).
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.loadgen import require_h2load, run_h2load
from bench.process import start_appliance
from bench.report import command_line, publish
from bench.serving import RESULTS, _grpc_body, machine
from bench.triton import CASES, Case, Running, perf_once, tree_cpu_seconds
from bench.triton_models import write_repository

__all__ = ["main"]

_FIGURES = ("inf/s", "p50 ms", "CPU µs/req")


def _start(repo: Path, state: Path, tree: Path | None, args: list[str]) -> Running:
    server = start_appliance(repo, state, *args, tree=tree)
    return Running(f"127.0.0.1:{server.port}", f"127.0.0.1:{server.grpc_port}", server.process.pid, server.stop)


def _measure(running: Running, model: str, run: Callable[[], tuple[float, float]]) -> tuple[float, float, float]:
    """``run()``'s throughput and p50 (ms), and the CPU µs a request the daemon's tree spent meanwhile."""
    served, cpu = running.successes(model), tree_cpu_seconds(running.pid)
    throughput, p50_ms = run()
    served = running.successes(model) - served
    cpu = tree_cpu_seconds(running.pid) - cpu
    return throughput, p50_ms, cpu / served * 1e6 if served else float("nan")


def _perf_analyzer(case: Case, url: str, protocol: str, concurrency: int, interval_ms: int) -> tuple[float, float]:
    best = perf_once(case, url, protocol, concurrency, interval_ms).best
    return best.throughput, best.p50_us / 1000


def _h2load(url: str, body: bytes, concurrency: int, interval_ms: int) -> tuple[float, float]:
    """One h2load run as long as about three of perf_analyzer's windows."""
    result, _ = run_h2load(f"http://{url}/inference.GRPCInferenceService/ModelInfer", body, concurrency,
                           max(1.0, 3 * interval_ms / 1000))
    return result.requests_per_s, result.p50_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--cases", type=lambda t: t.split(","), default=["identity"], help=",".join(CASES))
    parser.add_argument("--protocols", type=lambda t: t.split(","), default=["http", "grpc"])
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--interval-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    parser.add_argument("--in-process", action="store_true", help="every Python model marked in_process")
    parser.add_argument("--args", default="", help="extra daemon arguments for this tree")
    parser.add_argument("--baseline-args", default="", help="extra daemon arguments for the baseline")
    parser.add_argument("--client", choices=("perf_analyzer", "h2load"), default="perf_analyzer",
                        help="what drives the gRPC rows (h2load: the cases whose model takes INPUT0 alone)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.client == "h2load":
        require_h2load()
        bad = [case for case in args.cases if case in ("sequence", "decoupled")]
        if bad:
            parser.error(f"--client h2load drives one ModelInferRequest of INPUT0 alone; not the cases {bad}")
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; cases: {','.join(CASES)}")
    from tests.oracle import TritonUnavailable

    started = time.monotonic()
    rows: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    loads: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
            repo = write_repository(Path(tmp) / "repo", trusted=args.in_process)
            servers = {"baseline": _start(repo, Path(tmp) / "a", args.baseline, shlex.split(args.baseline_args))}
            try:
                servers["this tree"] = _start(repo, Path(tmp) / "b", None, shlex.split(args.args))
                for key in args.cases:  # warm-up: first requests pay for lazy set-up
                    case = CASES[key]
                    for running in servers.values():
                        protocol = case.protocols[-1]
                        perf_once(case, running.grpc if protocol == "grpc" else running.http, protocol, 2, 500)
                for key in args.cases:
                    case = CASES[key]
                    for protocol in (p for p in case.protocols if p in args.protocols):
                        for concurrency in args.concurrency:
                            row = rows.setdefault(f"{case.name}|{protocol}|{concurrency}", {n: [] for n in servers})
                            for round_ in range(args.rounds):
                                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                                for name in order:
                                    running = servers[name]
                                    url = running.grpc if protocol == "grpc" else running.http
                                    if protocol == "grpc" and args.client == "h2load":
                                        body = _grpc_body(case.model, ("INPUT0", "OUTPUT0",
                                                                       np.ones((1, 16), np.float32)))
                                        drive = functools.partial(_h2load, url, body, concurrency, args.interval_ms)
                                    else:
                                        drive = functools.partial(_perf_analyzer, case, url, protocol, concurrency,
                                                                  args.interval_ms)
                                    figures = _measure(running, case.model, drive)
                                    row[name].append(figures)
                                    loads.append(os.getloadavg()[0])
                                    print(f"  round {round_ + 1}/{args.rounds} {name:9} {case.name:30} {protocol:4} "
                                          f"c={concurrency:<3} {figures[0]:7.0f} inf/s  p50 {figures[1]:7.3f} ms  "
                                          f"{figures[2]:6.0f} µs CPU/req  load {loads[-1]:.2f}",
                                          file=sys.stderr, flush=True)
            finally:
                for running in servers.values():
                    running.stop()
    except TritonUnavailable as error:
        print(f"perf_analyzer is unavailable here, nothing measured: {error}", file=sys.stderr)
        return 1
    command = command_line("bench.ab", argv)
    lines = [f"Command: {command} ({time.monotonic() - started:.0f} s)", "",
             f"Machine: {machine()}; 1-minute load average {statistics.median(loads):.2f} (median; "
             f"{min(loads):.2f}-{max(loads):.2f}). Medians of {args.rounds} rounds; 'ratio' is the median of each "
             "round's this-tree/baseline ratio (throughput: > 1 is better; p50 and CPU: < 1 is better).", "",
             "| case | protocol | c | inf/s baseline → this | ratio | p50 ms baseline → this | ratio | "
             "CPU µs/req baseline → this | ratio |", "|" + "---|" * 9]
    for key, row in rows.items():
        case, protocol, concurrency = key.split("|")
        cells = []
        for index in range(len(_FIGURES)):
            before = statistics.median(r[index] for r in row["baseline"])
            after = statistics.median(r[index] for r in row["this tree"])
            ratio = statistics.median(b[index] / a[index] for a, b in zip(row["baseline"], row["this tree"])
                                      if a[index])
            cells += [f"{before:.{3 if index == 1 else 0}f} → {after:.{3 if index == 1 else 0}f}", f"{ratio:.2f}"]
        lines.append(f"| {case} | {protocol} | {concurrency} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    publish(text, args.out, "ab.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
