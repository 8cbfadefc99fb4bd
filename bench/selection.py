"""Is the plan the daemon chose really the fastest here? And what does a warm cache save?

    python -m bench.selection [--seconds 1.0] [--repeats 5]

Starts the daemon on a fresh state dir (127.0.0.1, mDNS off) with the benchmark CNN, records the time to
ready and the /selection decision; restarts it on the same state dir (warm cache) and records the time
to ready again; then measures every candidate plan separately in this process (batch 1, interleaved
repeats, medians) and prints one table: the tuner's numbers, the separate measurements, and how far
the chosen plan is from the fastest one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BACKENDS, LoadContext, RuntimeOptions
from appliance.core.config import complete_config
from appliance.selection import Plan
from bench.models import cnn_model
from bench.process import start_appliance


def _start_timed(repo: Path, state: Path) -> tuple[float, dict, object]:
    started = time.monotonic()
    server = start_appliance(repo, state)
    ready = time.monotonic() - started
    with urllib.request.urlopen(f"{server.base}/v2/models/cnn/selection", timeout=10) as response:
        return ready, json.load(response), server


def _measure_plans(model_file: Path, plans: list[dict], seconds: float, repeats: int) -> dict[str, float]:
    onnx = BACKENDS[0]
    config = mc.ModelConfig(name="cnn")
    probe = onnx.load(LoadContext("cnn", 1, model_file, config, RuntimeOptions()))
    config = complete_config(config, platform="onnxruntime_onnx", backend="onnxruntime",
                             default_filename="model.onnx", inputs=probe.inputs(), outputs=probe.outputs())
    x = {"image": np.random.default_rng(0).random((1, 3, 112, 112)).astype(np.float32)}
    loaded = {}
    for row in plans:
        plan = Plan(row["plan"], row["backend"], tuple(sorted(row["parameters"].items())))
        info = next(b for b in BACKENDS if b.name == plan.backend)
        # The same per-instance threads the daemon gives each of its two instances on this box.
        loaded[plan.id] = info.load(LoadContext("cnn", 1, model_file, plan.apply(config), RuntimeOptions(),
                                                threads=1))
    samples: dict[str, list[float]] = {p: [] for p in loaded}
    for _ in range(repeats):
        for plan_id, backend in loaded.items():
            for _ in range(5):
                backend.run(x, ["logits"])
            times = []
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                begin = time.perf_counter()
                backend.run(x, ["logits"])
                times.append(time.perf_counter() - begin)
            samples[plan_id].append(statistics.median(times))
    return {p: statistics.median(v) * 1000 for p, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo, state = Path(tmp) / "repo", Path(tmp) / "state"
        model_file = repo / "cnn" / "1" / "model.onnx"
        model_file.parent.mkdir(parents=True)
        model = cnn_model()
        model.ir_version = 8
        model_file.write_bytes(model.SerializeToString())
        cold, decision, server = _start_timed(repo, state)
        server.stop()
        warm, warm_decision, server = _start_timed(repo, state)
        server.stop()
        ok = [c for c in decision["candidates"] if c["status"] == "ok"]
        bench = _measure_plans(model_file, ok, args.seconds, args.repeats)
    fastest = min(bench, key=bench.__getitem__)
    chosen = decision["chosen"]
    lines = ["| plan | tuner latency ms (b=1) | tuner items/s (max b) | bench latency ms (b=1, median of "
             f"{args.repeats}×{args.seconds:g} s) | chosen |", "|---|---|---|---|---|"]
    for c in ok:
        lines.append(f"| {c['plan']} | {c['latency_ms']:.3f} | {c['throughput']:.1f} | {bench[c['plan']]:.3f} | "
                     f"{'yes' if c['plan'] == chosen else ''} |")
    for c in decision["candidates"]:
        if c["status"] != "ok":
            lines.append(f"| {c['plan']} | {c['status']}: {c.get('reason', '')} | | | |")
    lines.append("")
    lines.append(f"chosen {chosen}: {bench[chosen]:.3f} ms vs fastest in the bench {fastest} {bench[fastest]:.3f} ms "
                 f"-> {bench[chosen] / bench[fastest]:.3f}x (target <= 1.05x)")
    lines.append(f"time to ready: cold (tuning, cache {decision['cache']}) {cold:.2f} s; "
                 f"warm (cache {warm_decision['cache']}) {warm:.2f} s")
    text = "\n".join(lines)
    print(text)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "selection.md").write_text(f"Command: python -m bench.selection --seconds {args.seconds:g} "
                                      f"--repeats {args.repeats}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
