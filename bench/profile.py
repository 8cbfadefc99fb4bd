"""Flame graphs of the daemon's request path: py-spy samples the daemon while wrk drives one series.

    python -m bench.profile [--seconds 8] [--concurrency 1,16] [--tag after] [--native]
                            [--model tiny|identity_python|identity_onnx]
    python -m bench.profile --triton-case batching [--in-process] [--protocols http,grpc] ...

Starts the daemon on the bench repository (127.0.0.1, ephemeral ports, mDNS off), warms it up, then for
each concurrency runs ``py-spy record --pid`` for the length of a wrk run of the tiny MLP over JSON (and
with ``--protocols json,grpc`` an h2load run over gRPC) and writes
bench/results/flame-<tag>-<model>-<json|grpc>-c<N>.svg; the daemon's child processes (a Python model's)
are sampled too, each under its own root frame. ``--triton-case`` profiles one of bench.triton's cases
instead (its repository, driven by perf_analyzer as bench.triton drives it; ``--protocols http,grpc``;
``--in-process`` marks the models in_process): flame-<tag>-<case>-<http|grpc>-c<N>.svg. py-spy needs
ptrace rights over the daemon (root, or kernel.yama.ptrace_scope = 0): pip install py-spy.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.loadgen import require_h2load, require_wrk, run_h2load, run_wrk
from bench.models import write_repository
from bench.process import start_appliance
from bench.serving import _IDENTITY, _JSON, _TINY, RESULTS, _grpc_body, _json_body
from bench.triton import CASES as TRITON_CASES

_MODELS = {"tiny": _TINY, "identity_python": _IDENTITY, "identity_onnx": _IDENTITY}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--tag", default="after", help="names the SVGs (before/after)")
    parser.add_argument("--protocols", type=lambda t: t.split(","), default=["json"],
                        help="json (wrk), grpc (h2load) or both: json,grpc")
    parser.add_argument("--native", action="store_true", help="include native frames (C extensions)")
    parser.add_argument("--raw", action="store_true", help="collapsed stacks (.txt) instead of SVG, to read")
    parser.add_argument("--gil", action="store_true",
                        help="only samples holding the GIL: Python's CPU, without threads waiting in syscalls")
    parser.add_argument("--model", choices=sorted(_MODELS), default="tiny",
                        help="the bench repository's model to drive (identity_python: the Python backend)")
    parser.add_argument("--triton-case", choices=sorted(TRITON_CASES),
                        help="profile this case of bench.triton (its repository, driven by perf_analyzer)")
    parser.add_argument("--in-process", action="store_true", help="with --triton-case: models marked in_process")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.triton_case:
        return _profile_triton_case(args)
    require_wrk()
    if "grpc" in args.protocols:
        require_h2load()
    py_spy = _py_spy()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        appliance = start_appliance(repo, Path(tmp) / "state")
        try:
            tensor = _MODELS[args.model]
            url, body = f"{appliance.base}/v2/models/{args.model}/infer", _json_body(tensor)
            rpc = f"http://127.0.0.1:{appliance.grpc_port}/inference.GRPCInferenceService/ModelInfer"
            drivers = {
                "json": lambda c, seconds: run_wrk(url, body, _JSON, c, seconds),
                "grpc": lambda c, seconds: run_h2load(rpc, _grpc_body(args.model, tensor), c, seconds)[0],
            }
            for protocol in args.protocols:
                drivers[protocol](2, 2)  # warm-up
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    name = f"flame-{args.tag}-{args.model}-{protocol}-c{concurrency}.{'txt' if args.raw else 'svg'}"
                    drive = functools.partial(drivers[protocol], concurrency, args.seconds)
                    result = _record(py_spy, appliance.process.pid, args, args.out / name, drive)
                    print(f"{protocol} c={concurrency}: {result.requests_per_s:.0f} req/s, "
                          f"p50 {result.p50_ms:.3f} ms -> {args.out / name}")
        finally:
            appliance.stop()
    return 0


def _py_spy() -> str:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("the profile needs py-spy: pip install py-spy")
    return py_spy


def _profile_triton_case(args: argparse.Namespace) -> int:
    """One of bench.triton's cases, as bench.triton drives it, sampled while perf_analyzer runs."""
    from bench.triton import perf_once
    from bench.triton_models import write_repository as write_triton_repository

    py_spy = _py_spy()
    case = TRITON_CASES[args.triton_case]
    protocols = [p for p in args.protocols if p in case.protocols] or list(case.protocols[-1:])
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_triton_repository(Path(tmp) / "repo", trusted=args.in_process)
        appliance = start_appliance(repo, Path(tmp) / "state")
        try:
            urls = {"http": f"127.0.0.1:{appliance.port}", "grpc": f"127.0.0.1:{appliance.grpc_port}"}
            for protocol in protocols:
                perf_once(case, urls[protocol], protocol, 2, 500)  # warm-up
            for protocol in protocols:
                for concurrency in args.concurrency:
                    name = (f"flame-{args.tag}-{args.triton_case}{'-inprocess' if args.in_process else ''}-"
                            f"{protocol}-c{concurrency}.{'txt' if args.raw else 'svg'}")
                    # perf_analyzer measures three windows at least: together about the profile's length.
                    drive = functools.partial(perf_once, case, urls[protocol], protocol, concurrency,
                                              max(200, int(args.seconds * 1000 / 3)))
                    result = _record(py_spy, appliance.process.pid, args, args.out / name, drive).best
                    print(f"{protocol} c={concurrency}: {result.throughput:.0f} inf/s, "
                          f"p50 {result.p50_us / 1000:.3f} ms -> {args.out / name}")
        finally:
            appliance.stop()
    return 0


def _record(py_spy: str, pid: int, args: argparse.Namespace, path: Path, drive):
    """Sample ``pid`` with py-spy for as long as ``drive()`` loads it; ``drive``'s result."""
    command = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--duration", str(args.seconds), "--rate", "250",
               "--format", "raw" if args.raw else "flamegraph", "--output", str(path)]
    # Native stacks need the process paused while it is read; Python stacks are read without pausing.
    command.append("--native" if args.native else "--nonblocking")
    if args.gil:
        command.append("--gil")
    recorder = threading.Thread(target=subprocess.run, args=(command,), kwargs={"check": True, "capture_output": True})
    recorder.start()
    try:
        return drive()
    finally:
        recorder.join()


if __name__ == "__main__":
    raise SystemExit(main())
