"""The appliance against real Triton 2.51, both driven by NVIDIA's perf_analyzer on the same repository.

    python -m bench.triton [--repeats 3] [--interval-ms 1000] [--cases identity,batching,...]
                           [--protocols http,grpc] [--concurrency 1,16] [--in-process]
                           [--baseline CHECKOUT] [--no-triton]

Installs Triton and perf_analyzer into the cache outside the repository (tests/oracle: the
nvidia-pytriton 0.7.0 and tritonclient 2.51.0 wheels), writes one repository of Python-backend models
(bench/triton_models.py) and serves it with each server in turn, never both at once: per repeat one
server is started, measured on every case, protocol and concurrency, stopped, then the other; the order
alternates between repeats. Each figure is the median over the repeats. Beside throughput and client p50
(perf_analyzer's) the table gives the CPU time each server spent per request, its child processes
(the Python models' processes) included, read from /proc around each run: the figure a busy shared box
distorts least. ``--in-process`` adds a third server: the appliance with every Python model marked
``in_process`` (the plan for models the operator trusts). Targets: ≥ 1.0× Triton's throughput, ≤ 1.0×
its p50 and ≤ 1.0× its CPU per request on every row. A second table gives each server's idle memory: the
RSS of its whole process tree (the server and every model process) once it is ready and has sat idle
for a few seconds, before any request; target: the appliance's ≤ Triton's. Writes
bench/results/triton.md and triton.json.

``--baseline CHECKOUT`` adds the appliance run from another checkout (``git archive <commit> | tar -x -C
DIR``), alternated with the others in the same way: an A/B of a change. ``--no-triton`` leaves Triton out;
the table's ratios are then over the baseline's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.process import rss_mib, start_appliance
from bench.report import command_line, publish
from bench.serving import RESULTS, machine
from bench.triton_models import REPEATS, write_repository

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
"""/proc's unit of CPU time."""
_SETTLE_S = 3.0
"""Seconds a server sits idle after it is ready before its memory is read."""
BASELINE = "baseline"
"""The server name of the appliance run from ``--baseline``'s checkout."""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: str
    """The model perf_analyzer calls (whose statistics count the requests)."""
    args: tuple[str, ...]
    protocols: tuple[str, ...] = ("http", "grpc")


CASES = {
    "identity": Case("Python identity FP32[16]", "identity", ("--shape", "INPUT0:16")),
    "batching": Case("dynamic batching", "identity_batched", ("--shape", "INPUT0:16")),
    "bls": Case("BLS (Python calling Python)", "bls", ("--shape", "INPUT0:16")),
    "ensemble": Case("ensemble of two Python steps", "pipeline", ("--shape", "INPUT0:16")),
    "sequence": Case("sequences (direct, 8 slots)", "accumulate", ("--sequence-length", "20")),
    "decoupled": Case(f"decoupled repeat ({REPEATS} responses), stream", "repeat", ("--streaming",), ("grpc",)),
}


def process_tree(pid: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """``pid`` and every process below it, each once: its pid, the fields of its /proc stat after the
    command name, and its threads' ids. Children are listed per thread: the appliance starts its model
    processes from a thread of their own. A process that exits meanwhile is left out (or its children,
    if it exits while they are listed)."""
    todo, seen = [pid], set()
    while todo:
        process = todo.pop()
        if process in seen:
            continue
        seen.add(process)
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            tasks = os.listdir(f"/proc/{process}/task")
        except (OSError, IndexError):  # exited meanwhile
            continue
        try:
            for task in tasks:
                todo += [int(c) for c in Path(f"/proc/{process}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):  # exited while its children were listed
            pass
        yield process, fields, tasks


def tree_cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and every process below it (its children's live times plus what
    reaped children left in its cutime/cstime)."""
    total = 0
    for _, fields, _ in process_tree(pid):
        try:
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
        except (IndexError, ValueError):
            continue
    return total / TICKS_PER_SECOND


def tree_rss_mib(pid: int) -> tuple[float, int]:
    """Resident memory of ``pid`` and every process below it, in MiB, and how many processes that is."""
    total, count = 0.0, 0
    for process, _, _ in process_tree(pid):
        try:
            total += rss_mib(process)
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
        count += 1
    return total, count


@dataclasses.dataclass
class Running:
    """A server being measured: its addresses, its pid, how to stop it."""

    http: str
    grpc: str
    pid: int
    stop: Callable[[], Any]

    def successes(self, model: str) -> int:
        with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/stats", timeout=10) as response:
            stats = json.load(response)["model_stats"]
        return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def _start_triton(repo: Path, work: Path) -> Running:
    from tests.oracle import TritonServer

    server = TritonServer(repo, log_path=work / "tritonserver.log").start()
    return Running(server.http_url, server.grpc_url, server.pid, server.stop)


def _start_appliance(repo: Path, work: Path, tree: Path | None = None) -> Running:
    server = start_appliance(repo, work / "state", tree=tree)
    return Running(f"127.0.0.1:{server.port}", f"127.0.0.1:{server.grpc_port}", server.process.pid, server.stop)


_WINDOW_TOO_SHORT = ("stable measurement", "No valid requests recorded")


def perf_once(case: Case, url: str, protocol: str, concurrency: int, interval_ms: int) -> Any:
    from tests.oracle import TritonUnavailable, run_perf_analyzer

    # No stability check to speak of (-s: windows may differ 1000-fold; the box is shared, and the repeats'
    # median is the figure), three windows. A run a stall on the box still fails is tried once more with
    # windows twice as long.
    for attempt in range(2):
        try:
            return run_perf_analyzer(["-m", case.model, "-u", url, "-i", protocol, *case.args,
                                      "--concurrency-range", f"{concurrency}:{concurrency}",
                                      "-p", str(interval_ms * (attempt + 1)), "-s", "100000", "--max-trials", "3"],
                                     timeout=120)
        except TritonUnavailable as error:
            if attempt or not any(text in str(error) for text in _WINDOW_TOO_SHORT):
                raise
            print(f"  perf_analyzer: windows too short on this box ({case.model}, {protocol}, c={concurrency}): "
                  "trying once more with windows twice as long", file=sys.stderr)
    raise AssertionError("unreachable")


def _runs(args: argparse.Namespace) -> Iterator[tuple[Case, str, int]]:
    for key in args.cases:
        case = CASES[key]
        for protocol in case.protocols:
            if protocol in args.protocols:
                for concurrency in args.concurrency:
                    yield case, protocol, concurrency


def _measure_server(running: Running, args: argparse.Namespace, record: Callable[..., None]) -> None:
    from tests.oracle import TritonUnavailable

    for key in args.cases:  # warm-up: first requests pay for lazy set-up on both servers
        case = CASES[key]
        protocol = case.protocols[-1]
        try:
            perf_once(case, running.grpc if protocol == "grpc" else running.http, protocol, 2, 500)
        except TritonUnavailable as error:  # the measured runs that follow report a server that fails
            print(f"  warm-up of {case.model} failed: {error}", file=sys.stderr)
    for case, protocol, concurrency in _runs(args):
        url = running.grpc if protocol == "grpc" else running.http
        served, cpu = running.successes(case.model), tree_cpu_seconds(running.pid)
        result = perf_once(case, url, protocol, concurrency, args.interval_ms)
        served = running.successes(case.model) - served
        cpu = tree_cpu_seconds(running.pid) - cpu
        record(case, protocol, concurrency, result.best.throughput, result.best.p50_us / 1000,
               cpu / served * 1e6 if served else float("nan"), os.getloadavg()[0])


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    repo = write_repository(work / "repo")
    servers: dict[str, Callable[[], Running]] = {}
    if not args.no_triton:
        servers["triton"] = lambda: _start_triton(repo, work / "triton")
    if args.baseline is not None:
        servers[BASELINE] = lambda: _start_appliance(repo, work / "baseline", args.baseline)
    servers["appliance"] = lambda: _start_appliance(repo, work / "appliance")
    if args.in_process:
        trusted = write_repository(work / "repo-trusted", trusted=True)
        servers["appliance in-process"] = lambda: _start_appliance(trusted, work / "appliance-trusted")
        if args.baseline is not None:
            servers[f"{BASELINE} in-process"] = lambda: _start_appliance(trusted, work / "baseline-trusted",
                                                                         args.baseline)
    return {**alternate(servers, args),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}}


def alternate(servers: dict[str, Callable[[], Running]], args: argparse.Namespace) -> dict[str, Any]:
    """Each server in turn, started, measured on every case, protocol and concurrency, and stopped, the
    order reversed every other repeat: the medians over the repeats by server, the runs, the machine and
    the load average."""
    raw: dict[str, dict[str, list[tuple[float, ...]]]] = {name: {} for name in servers}
    idle: dict[str, list[tuple[float, int]]] = {name: [] for name in servers}
    loads: list[float] = []
    for repeat in range(args.repeats):
        order = list(servers) if repeat % 2 == 0 else list(reversed(servers))
        for name in order:
            running = servers[name]()
            time.sleep(_SETTLE_S)
            idle[name].append(tree_rss_mib(running.pid))
            print(f"  repeat {repeat + 1}/{args.repeats} {name:20} idle: {idle[name][-1][0]:.1f} MiB in "
                  f"{idle[name][-1][1]} processes", file=sys.stderr, flush=True)

            def record(case: Case, protocol: str, concurrency: int, *figures: float, name: str = name,
                       repeat: int = repeat) -> None:
                key = f"{case.name}|{protocol}|{concurrency}"
                raw[name].setdefault(key, []).append(figures)
                loads.append(figures[-1])
                print(f"  repeat {repeat + 1}/{args.repeats} {name:20} {case.name:42} {protocol:4} c={concurrency:<3}"
                      f" {figures[0]:8.0f} inf/s  p50 {figures[1]:7.3f} ms  {figures[2]:6.0f} µs CPU/req  "
                      f"load {figures[3]:.2f}", file=sys.stderr, flush=True)

            try:
                _measure_server(running, args, record)
            finally:
                running.stop()
    medians = {name: {key: [statistics.median(values) for values in zip(*rows)] for key, rows in by_key.items()}
               for name, by_key in raw.items()}
    idle_rss = {name: [statistics.median(m for m, _ in rows), max(n for _, n in rows)]
                for name, rows in idle.items() if rows}
    return {"medians": medians, "runs": raw, "idle_rss": idle_rss, "machine": machine(),
            "load_average": {"median": statistics.median(loads), "min": min(loads), "max": max(loads)}}


def table(data: dict[str, Any]) -> str:
    medians = data["medians"]
    reference = "triton" if "triton" in medians else BASELINE
    triton = medians[reference]
    others = [name for name in medians if name != reference]
    title = "Triton" if reference == "triton" else "baseline"
    lines = [f"| case | protocol | c | server | inf/s ({title}) | × {title} | p50 ms ({title}) | p50 × {title} | "
             f"CPU µs/req ({title}) | throughput ≥ 1.0× | p50 ≤ 1.0× | CPU ≤ 1.0× | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, base in triton.items():
        case, protocol, concurrency = key.split("|")
        for name in others:
            mine = medians[name].get(key)
            if mine is None:
                continue
            rate, p50, cpu = mine[0] / base[0], mine[1] / base[1], mine[2] / base[2]
            lines.append(f"| {case} | {protocol} | {concurrency} | {name} | {mine[0]:.0f} ({base[0]:.0f}) | "
                         f"{rate:.2f} | {mine[1]:.3f} ({base[1]:.3f}) | {p50:.2f} | {mine[2]:.0f} ({base[2]:.0f}) | "
                         f"{'met' if rate >= 1.0 else 'MISSED'} | {'met' if p50 <= 1.0 else 'MISSED'} | "
                         f"{'met' if cpu <= 1.0 else 'MISSED'} | {statistics.median([mine[3], base[3]]):.1f} |")
    return "\n".join(lines)


DOUBLED = 2.0
"""Identity at c=16: the appliance's throughput over Triton's, at least (issue 49)."""


def doubled(data: dict[str, Any]) -> str:
    """The identity case at c=16 against ``DOUBLED``× Triton's throughput, a line per protocol and server
    measured against Triton ("" without Triton or that case)."""
    medians = data["medians"]
    triton = medians.get("triton")
    if triton is None:
        return ""
    lines = []
    for key, base in triton.items():
        case, protocol, concurrency = key.split("|")
        if case != CASES["identity"].name or concurrency != "16":
            continue
        for name, mine in medians.items():
            if name != "triton" and key in mine:
                rate = mine[key][0] / base[0]
                lines.append(f"- {'met' if rate >= DOUBLED else 'MISSED'}: {case}, {protocol}, c=16, {name}: "
                             f"throughput ≥ {DOUBLED:.1f}× Triton's ({rate:.2f}×)")
    return "\n".join(lines)


def idle_table(data: dict[str, Any]) -> str:
    """Each server's idle memory (whole tree), against the reference's: target ≤ 1.0×."""
    idle = data.get("idle_rss", {})
    reference = "triton" if "triton" in idle else BASELINE
    if reference not in idle:
        return ""
    base = idle[reference][0]
    lines = ["| server | idle RSS of the whole tree, MiB | processes | × " + reference + " | RSS ≤ 1.0× |",
             "|---|---|---|---|---|"]
    for name, (mib, processes) in idle.items():
        ratio = mib / base
        verdict = "" if name == reference else ("met" if ratio <= 1.0 else "MISSED")
        lines.append(f"| {name} | {mib:.1f} | {processes} | {ratio:.2f} | {verdict} |")
    return "\n".join(lines)


def add_run_options(parser: argparse.ArgumentParser, cases: list[str]) -> None:
    """The options of every bench that drives these cases with perf_analyzer (``cases``: the default)."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    parser.add_argument("--cases", type=lambda t: t.split(","), default=cases, help=",".join(CASES))
    parser.add_argument("--protocols", type=lambda t: t.split(","), default=["http", "grpc"])
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--out", type=Path, default=RESULTS)


def parse_run_options(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; cases: {','.join(CASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(parser, list(CASES))
    parser.add_argument("--in-process", action="store_true",
                        help="also measure the appliance with every Python model marked in_process")
    parser.add_argument("--baseline", type=Path, help="also measure the appliance from this checkout (an A/B)")
    parser.add_argument("--no-triton", action="store_true", help="leave real Triton out (needs --baseline)")
    args = parse_run_options(parser, argv)
    if args.no_triton and args.baseline is None:
        parser.error("--no-triton needs --baseline: the table's ratios are over one of the two")
    from tests.oracle import TritonUnavailable

    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
            data = measure(args, Path(tmp))
    except TritonUnavailable as error:
        print(f"real Triton is unavailable here, nothing measured: {error}", file=sys.stderr)
        return 1
    load = data["load_average"]
    command = command_line("bench.triton", argv)
    text = (f"Command: {command} ({time.monotonic() - started:.0f} s)\n\n"
            f"Machine: {data['machine']}; shared with other work: 1-minute load average {load['median']:.2f} "
            f"(median; {load['min']:.2f}-{load['max']:.2f}) over the runs. Medians of {args.repeats} repeats, "
            "servers alternated; perf_analyzer 2.51 (client p50); CPU per request of the server's whole "
            "process tree.\n\n" + table(data) + "\n\nIdentity at c=16 against twice Triton's throughput:\n\n"
            + (doubled(data) or "- not measured") + "\n\nIdle memory (medians over the repeats, before any "
            "request):\n\n" + idle_table(data))
    publish(text, args.out, "triton.md")
    (args.out / "triton.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
