"""What on-device metrics cost, and how big their history grows.

    python -m bench.metrics overhead [--seconds 4] [--repeats 3]   # metrics on vs off, c=1 and c=16
    python -m bench.metrics soak [--seconds 600] [--concurrency 4]   # metrics.db size after sustained load

Both start the daemon(s) on 127.0.0.1 with mDNS off and drive the tiny MLP over JSON with wrk on loopback.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.loadgen import require_wrk, run_wrk
from bench.models import write_repository
from bench.process import start_appliance
from bench.serving import _TINY, _json_body

_HEADERS = {"Content-Type": "application/json"}


def overhead(args: argparse.Namespace, workdir: Path) -> str:
    repo = write_repository(workdir / "repo")
    servers = {
        "metrics on": start_appliance(repo, workdir / "on", "--no-selection"),
        "metrics off": start_appliance(repo, workdir / "off", "--no-selection", "--no-metrics"),
    }
    body = _json_body(_TINY)
    results: dict[tuple[str, int], list] = {}
    try:
        for server in servers.values():
            run_wrk(f"{server.base}/v2/models/tiny/infer", body, _HEADERS, 2, 1)
        for _ in range(args.repeats):
            for concurrency in (1, 16):
                for name, server in servers.items():
                    result = run_wrk(f"{server.base}/v2/models/tiny/infer", body, _HEADERS, concurrency, args.seconds)
                    results.setdefault((name, concurrency), []).append(result)
    finally:
        for server in servers.values():
            server.stop()
    lines = ["| c | metrics | req/s | p50 ms | p99 ms | ratio on/off (req/s) |", "|---|---|---|---|---|---|"]
    for concurrency in (1, 16):
        rps = {n: statistics.median(r.requests_per_s for r in results[(n, concurrency)]) for n in servers}
        for name in servers:
            runs = results[(name, concurrency)]
            ratio = f"{rps['metrics on'] / rps['metrics off']:.3f}" if name == "metrics on" else ""
            lines.append(f"| {concurrency} | {name} | {rps[name]:.1f} | "
                         f"{statistics.median(r.p50_ms for r in runs):.3f} | "
                         f"{statistics.median(r.p99_ms for r in runs):.3f} | {ratio} |")
    return "\n".join(lines)


def soak(args: argparse.Namespace, workdir: Path) -> str:
    repo = write_repository(workdir / "repo")
    state = workdir / "state"
    server = start_appliance(repo, state, "--no-selection")
    body = _json_body(_TINY)
    total = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            chunk = min(60.0, args.seconds - (time.monotonic() - started))
            result = run_wrk(f"{server.base}/v2/models/tiny/infer", body, _HEADERS, args.concurrency, max(1, chunk))
            total += int(result.requests_per_s * max(1, round(chunk)))
            print(f"  {time.monotonic() - started:6.0f} s: {result.requests_per_s:.0f} req/s", file=sys.stderr)
    finally:
        server.stop()
    files = {p.name: p.stat().st_size for p in state.glob("metrics.db*")}
    return (f"{args.seconds:.0f} s of load at c={args.concurrency} (~{total} requests, one model busy, three loaded): "
            f"metrics.db files {files}, total {sum(files.values()) / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["overhead", "soak"])
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (4.0 if args.mode == "overhead" else 600.0)
    require_wrk()
    with tempfile.TemporaryDirectory() as tmp:
        text = (overhead if args.mode == "overhead" else soak)(args, Path(tmp))
    print(text)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"metrics-{args.mode}.md").write_text(f"Command: python -m bench.metrics {args.mode} "
                                                 f"--seconds {args.seconds:g}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
