"""CPU time per request: what the daemon's process spends per answered request, beside the floor's.

    python -m bench.request_cost [--seconds 3] [--repeats 5] [--baseline DIR]

Throughput on a box shared with other work swings with their load; the CPU time a server spends per
request hardly does. This drives the tiny MLP over JSON with wrk (c=1 and c=16) at the bare aiohttp
handler (the floor), at this tree's daemon, at the same daemon with nothing measured (so every batch runs
on an instance thread) and on asyncio's own loop, and (with
``--baseline DIR``, a checkout of another commit) at that tree's daemon, interleaved, and reads each
process's user+system time (its children's too) from /proc around every run. Medians of the repeats go
to bench/results/request-cost.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.loadgen import require_wrk, run_wrk
from bench.models import write_repository
from bench.process import Server, start_appliance, start_floor
from bench.report import publish
from bench.serving import _JSON, _TINY, RESULTS, _json_body, machine
from bench.triton import tree_cpu_seconds

_HERE = str(Path(__file__).resolve().parent.parent)


def cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and every process below it (a Python model's process), in seconds."""
    return tree_cpu_seconds(pid)


def _start(name: str, tree: str, repo: Path, state: Path, *args: str) -> Server:
    # The daemon's code: this tree or the baseline's (``python -m`` looks in the working directory first).
    os.environ["PYTHONPATH"] = tree
    here = os.getcwd()
    os.chdir(tree)
    try:
        if name == "floor":
            return start_floor(repo / "tiny" / "1" / "model.onnx")
        return start_appliance(repo, state, "--no-grpc", *args)
    finally:
        os.chdir(here)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="a checkout of another commit to compare with")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    body = _json_body(_TINY)
    variants = {"floor": (_HERE, ()), "appliance": (_HERE, ()),
                "appliance, threaded (--no-selection)": (_HERE, ("--no-selection",)),
                "appliance, asyncio loop": (_HERE, ("--event-loop", "asyncio"))}
    if args.baseline:
        variants["baseline"] = (str(args.baseline.resolve()), ())
    saved = os.environ.get("PYTHONPATH")
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        servers: dict[str, tuple[Server, str]] = {}
        try:
            for index, (name, (tree, extra)) in enumerate(variants.items()):
                server = _start(name, tree, repo, Path(tmp) / f"state{index}", *extra)
                servers[name] = (server, "/infer" if name == "floor" else "/v2/models/tiny/infer")
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
            for server, path in servers.values():
                run_wrk(server.base + path, body, _JSON, 4, 2)  # warm-up
            for repeat in range(args.repeats):
                for concurrency in (1, 16):
                    for name, (server, path) in servers.items():
                        before = cpu_seconds(server.process.pid)
                        result = run_wrk(server.base + path, body, _JSON, concurrency, args.seconds)
                        used = cpu_seconds(server.process.pid) - before
                        served = result.requests_per_s * max(1, round(args.seconds))
                        results.setdefault((name, concurrency), []).append(
                            (result.requests_per_s, result.p50_ms, used / served * 1e6))
                        loads.append(os.getloadavg()[0])
                        print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency:<3} {name:24} "
                              f"{used / served * 1e6:7.1f} µs CPU/request  load {loads[-1]:.2f}", file=sys.stderr)
        finally:
            for server, _ in servers.values():
                server.stop()
    floor = {c: statistics.median(r[2] for r in results[("floor", c)]) for c in (1, 16)}
    lines = [f"Machine: {machine()}; 1-minute load average {statistics.median(loads):.2f} (median; "
             f"{min(loads):.2f}-{max(loads):.2f})", "",
             f"Command: python -m bench.request_cost --seconds {args.seconds:g} --repeats {args.repeats}"
             f"{' --baseline <checkout of the commit before>' if args.baseline else ''}", "",
             "| server | c | CPU µs per request | × floor | req/s | p50 ms |", "|---|---|---|---|---|---|"]
    for (name, concurrency), rows in results.items():
        cost = statistics.median(r[2] for r in rows)
        lines.append(f"| {name} | {concurrency} | {cost:.0f} | {cost / floor[concurrency]:.2f} | "
                     f"{statistics.median(r[0] for r in rows):.0f} | {statistics.median(r[1] for r in rows):.2f} |")
    text = "\n".join(lines)
    publish(text, args.out, "request-cost.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
