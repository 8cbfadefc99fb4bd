"""What serving gRPC costs in memory: the daemon's resident set with gRPC on and off.

    python -m bench.idle_rss [--repeats 3] [--settle 5]

Starts the daemon (127.0.0.1, ephemeral ports, mDNS and selection off) over the benchmark repository,
alternately with and without --no-grpc, and reads VmRSS of the daemon process once it is ready and has
sat idle for --settle seconds, then again after 200 requests over each protocol it serves and another
idle pause. Medians go to bench/results/idle-rss.md. Target: gRPC on costs at most 30 MiB more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.models import write_repository
from bench.process import Server, rss_mib, start_appliance
from bench.report import publish

RESULTS = Path(__file__).parent / "results"
TARGET_MIB = 30.0


def _traffic(server: Server, requests: int) -> None:
    """Requests over HTTP and, when served, over gRPC (with Triton's own clients)."""
    x = np.random.default_rng(0).random((1, 784)).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    for _ in range(requests):
        request = urllib.request.Request(f"{server.base}/v2/models/tiny/infer", data=body, method="POST")
        urllib.request.urlopen(request, timeout=10).read()
    if server.grpc_port is not None:
        import tritonclient.grpc as triton

        with triton.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
            tensor = triton.InferInput("input", [1, 784], "FP32")
            tensor.set_data_from_numpy(x)
            for _ in range(requests):
                client.infer("tiny", [tensor])


def measure(repeats: int, settle: float, workdir: Path) -> dict[str, dict[str, list[float]]]:
    repo = write_repository(workdir / "repo")
    samples: dict[str, dict[str, list[float]]] = {mode: {"idle": [], "after traffic": []} for mode in ("on", "off")}
    for repeat in range(repeats):
        for mode in ("on", "off"):
            args = ["--no-selection", "--no-metrics"] + (["--no-grpc"] if mode == "off" else [])
            server = start_appliance(repo, workdir / f"state-{mode}-{repeat}", *args)
            try:
                time.sleep(settle)
                samples[mode]["idle"].append(rss_mib(server.process.pid))
                _traffic(server, 200)
                time.sleep(settle)
                samples[mode]["after traffic"].append(rss_mib(server.process.pid))
            finally:
                server.stop()
            print(f"  repeat {repeat + 1}/{repeats} gRPC {mode:3}: idle {samples[mode]['idle'][-1]:.1f} MiB, "
                  f"after traffic {samples[mode]['after traffic'][-1]:.1f} MiB", file=sys.stderr)
    return samples


def report(samples: dict[str, dict[str, list[float]]], repeats: int, settle: float) -> str:
    lines = [f"Command: python -m bench.idle_rss --repeats {repeats} --settle {settle:g}", "",
             "| daemon | idle RSS MiB (median) | after 200 requests per protocol, idle again |", "|---|---|---|"]
    medians = {mode: {k: statistics.median(v) for k, v in by.items()} for mode, by in samples.items()}
    for mode in ("off", "on"):
        lines.append(f"| gRPC {mode} | {medians[mode]['idle']:.1f} | {medians[mode]['after traffic']:.1f} |")
    lines.append("")
    lines.append("Targets:")
    for when in ("idle", "after traffic"):
        growth = medians["on"][when] - medians["off"][when]
        lines.append(f"- {'met' if growth <= TARGET_MIB else 'MISSED'}: gRPC on costs at most {TARGET_MIB:g} MiB "
                     f"({when}: {growth:+.1f} MiB)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0, help="idle seconds before each reading")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        samples = measure(args.repeats, args.settle, Path(tmp))
    text = report(samples, args.repeats, args.settle)
    publish(text, args.out, "idle-rss.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
