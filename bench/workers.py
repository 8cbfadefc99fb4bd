"""Front-end workers against their cost: the daemon with ``workers`` = 0 (it serves the HTTP port itself)
and with worker processes, pinned to the same cores, driven by wrk over the infer lane (small JSON
requests to bench.triton's Python identity model, FP32[16]), wrk pinned to the cores left over.

    python -m bench.workers [--cores N] [--workers 0,2,4] [--concurrency 16,64] [--seconds 5] [--repeats 3]

``--cores``: the cores the daemon's tree is pinned to (default: half the box, at least 1; wrk gets the
rest, or shares them on a box of 2 or fewer). Per repeat each workers setting is started, measured at every
concurrency and stopped, the order alternating between repeats; figures are medians over the repeats. The
table gives throughput, p50 and the CPU per request of each part of the tree (the daemon, its workers,
the model processes), and each setting's throughput over the daemon alone: the workers pay where that
is above 1. Writes bench/results/workers.md and workers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.loadgen import require_wrk, run_wrk
from bench.process import start_appliance
from bench.serving import RESULTS
from bench.triton import TICKS_PER_SECOND, process_tree
from bench.triton_models import write_repository

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) for i in range(16)]}]}).encode()


def cpu_by_part(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the daemon ``pid``, of its front-end workers and of everything else
    below it (the model processes)."""
    parts = {"daemon": 0.0, "workers": 0.0, "models": 0.0}
    for process, fields, _ in process_tree(pid):
        try:
            seconds = (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND
            command = Path(f"/proc/{process}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
        part = "daemon" if process == pid else "workers" if b"appliance.workers.worker" in command else "models"
        parts[part] += seconds
    return parts


def _pinning(cores: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """taskset prefixes for the daemon's tree and for wrk."""
    available = sorted(os.sched_getaffinity(0))
    daemon = available[:cores]
    rest = available[cores:] or available
    return (("taskset", "-c", ",".join(map(str, daemon))), ("taskset", "-c", ",".join(map(str, rest))))


def measure_one(repo: Path, state: Path, workers: int, args: argparse.Namespace) -> dict[int, list[float]]:
    """One start of the daemon with ``workers``: per concurrency [inf/s, p50 ms, CPU µs/req of the
    daemon, the workers, the models]."""
    daemon_pin, wrk_pin = _pinning(args.cores)
    server = start_appliance(repo, state, "--no-grpc", env={"APPLIANCE_WORKERS": str(workers)}, prefix=daemon_pin)
    url = f"{server.base}/v2/models/identity/infer"
    rows: dict[int, list[float]] = {}
    try:
        run_wrk(url, BODY, {"Content-Type": "application/json"}, 4, 1, prefix=wrk_pin)  # warm-up
        for concurrency in args.concurrency:
            before = cpu_by_part(server.process.pid)
            result = run_wrk(url, BODY, {"Content-Type": "application/json"}, concurrency, args.seconds,
                             prefix=wrk_pin)
            after = cpu_by_part(server.process.pid)
            if result.errors:
                raise RuntimeError(f"wrk saw {result.errors} errors at c={concurrency} with workers={workers}")
            served = result.requests_per_s * round(args.seconds)
            rows[concurrency] = [result.requests_per_s, result.p50_ms,
                                 *(1e6 * (after[k] - before[k]) / served for k in ("daemon", "workers", "models"))]
            print(f"  workers={workers} c={concurrency:<3} {result.requests_per_s:8.0f} inf/s  p50 "
                  f"{result.p50_ms:6.3f} ms  CPU µs/req daemon {rows[concurrency][2]:.0f} workers "
                  f"{rows[concurrency][3]:.0f} models {rows[concurrency][4]:.0f}", flush=True)
    finally:
        server.stop()
    return rows


def table(medians: dict[int, dict[int, list[float]]]) -> str:
    settings = list(medians)
    base = settings[0]
    lines = ["| workers | c | inf/s | p50 ms | CPU µs/req: daemon | workers | models | tree | "
             f"× inf/s vs workers={base} | × daemon CPU/req |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for workers in settings:
        for concurrency, row in medians[workers].items():
            reference = medians[base][concurrency]
            lines.append(f"| {workers} | {concurrency} | {row[0]:.0f} | {row[1]:.3f} | {row[2]:.0f} | {row[3]:.0f} | "
                         f"{row[4]:.0f} | {sum(row[2:5]):.0f} | {row[0] / reference[0]:.2f} | "
                         f"{row[2] / reference[2]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    available = len(os.sched_getaffinity(0))
    parser.add_argument("--cores", type=int, default=max(1, available // 2))
    parser.add_argument("--workers", type=lambda t: [int(w) for w in t.split(",")], default=[0, 2])
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[16, 64])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not 1 <= args.cores <= available:
        parser.error(f"--cores must lie between 1 and this box's {available} usable cores")
    require_wrk()
    started = time.monotonic()
    runs: dict[int, list[dict[int, list[float]]]] = {w: [] for w in args.workers}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        repo = write_repository(Path(tmp) / "repo")
        for repeat in range(args.repeats):
            order = args.workers if repeat % 2 == 0 else list(reversed(args.workers))
            for workers in order:
                runs[workers].append(measure_one(repo, Path(tmp) / f"state-{workers}", workers, args))
                loads.append(os.getloadavg()[0])
    medians: dict[int, dict[int, list[float]]] = {
        w: {c: [statistics.median(run[c][i] for run in runs[w]) for i in range(5)] for c in args.concurrency}
        for w in args.workers}
    command = " ".join(["python -m bench.workers", *(argv if argv is not None else sys.argv[1:])])
    text = (f"Command: {command} ({time.monotonic() - started:.0f} s)\n\n"
            f"Machine: {os.cpu_count()} CPUs ({available} usable), the daemon's tree pinned to {args.cores}, wrk to "
            f"the rest; 1-minute load average {statistics.median(loads):.2f} (median; {min(loads):.2f}-"
            f"{max(loads):.2f}). Medians of {args.repeats} repeats, settings alternated; JSON infer of FP32[16] "
            "to a Python identity model over the infer lane.\n\n" + table(medians))
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "workers.md").write_text(text + "\n")
    (args.out / "workers.json").write_text(json.dumps({"runs": runs, "medians": medians, "loads": loads}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
