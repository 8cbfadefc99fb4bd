"""Flame graphs of the daemon's request path: py-spy samples the daemon while wrk drives one series.

    python -m bench.profile [--seconds 8] [--concurrency 1,16] [--tag after] [--native]

Starts the daemon on the bench repository (127.0.0.1, ephemeral ports, mDNS off), warms it up, then for
each concurrency runs ``py-spy record --pid`` for the length of a wrk run of the tiny MLP over JSON and
writes bench/results/flame-<tag>-tiny-json-c<N>.svg. py-spy needs ptrace rights over the daemon (root,
or kernel.yama.ptrace_scope = 0): pip install py-spy.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.loadgen import require_wrk, run_wrk
from bench.models import write_repository
from bench.process import start_appliance
from bench.serving import _JSON, _TINY, RESULTS, _json_body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--tag", default="after", help="names the SVGs (before/after)")
    parser.add_argument("--native", action="store_true", help="include native frames (C extensions)")
    parser.add_argument("--raw", action="store_true", help="collapsed stacks (.txt) instead of SVG, to read")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("the profile needs py-spy: pip install py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        appliance = start_appliance(repo, Path(tmp) / "state")
        try:
            url, body = f"{appliance.base}/v2/models/tiny/infer", _json_body(_TINY)
            run_wrk(url, body, _JSON, 2, 2)  # warm-up
            for concurrency in args.concurrency:
                svg = args.out / f"flame-{args.tag}-tiny-json-c{concurrency}.{'txt' if args.raw else 'svg'}"
                command = [py_spy, "record", "--pid", str(appliance.process.pid), "--duration", str(args.seconds),
                           "--rate", "250", "--format", "raw" if args.raw else "flamegraph", "--output", str(svg), "--nonblocking"]
                if args.native:
                    command.append("--native")
                recorder = threading.Thread(target=subprocess.run, args=(command,),
                                            kwargs={"check": True, "capture_output": True})
                recorder.start()
                result = run_wrk(url, body, _JSON, concurrency, args.seconds)
                recorder.join()
                print(f"c={concurrency}: {result.requests_per_s:.0f} req/s, p50 {result.p50_ms:.3f} ms -> {svg}")
        finally:
            appliance.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
