"""Is the plan the daemon chose really the best here, for each objective? And what does a warm cache save?

    python -m bench.selection [--seconds 1.0] [--repeats 3] [--concurrency 16]

Starts the daemon on a fresh state dir (127.0.0.1, mDNS off) with the benchmark CNN twice: ``cnn`` with
the default objective (latency) and ``cnn_throughput`` with ``objective: throughput``; records the time
to ready and both /selection decisions; restarts it on the same state dir (warm cache) and records the
time to ready again. Then it measures every candidate the tuner measured (each backend in each
instance x thread variant) separately, in this process and with its own loops: latency as the median
of one request at a time on one instance (batch 1), throughput as items/s with ``--concurrency``
clients sharing the plan's instances (each sending the model's max batch, as the dynamic batcher would
form it), interleaved repeats, medians. It prints one table and how far each chosen plan is from the
best one measured separately for its objective (target: within 5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import Backend, LoadContext, RuntimeOptions, named
from appliance.repository.config import complete_config
from bench.models import cnn_model
from bench.process import start_appliance

MODELS = {"cnn": "", "cnn_throughput": 'parameters { key: "objective" value: { string_value: "throughput" } }\n'}


def _write_repository(root: Path) -> Path:
    model = cnn_model()
    model.ir_version = 8
    for name, config in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
        (root / name / "config.pbtxt").write_text(config)
    return root / "cnn" / "1" / "model.onnx"


def _start_timed(repo: Path, state: Path) -> tuple[float, dict[str, dict]]:
    started = time.monotonic()
    server = start_appliance(repo, state)
    ready = time.monotonic() - started
    try:
        decisions = {}
        for name in MODELS:
            with urllib.request.urlopen(f"{server.base}/v2/models/{name}/selection", timeout=10) as response:
                decisions[name] = json.load(response)
    finally:
        server.stop()
    return ready, decisions


def _load(model_file: Path, row: dict) -> tuple[list[Backend], mc.ModelConfig]:
    onnx = named("onnxruntime")
    config = mc.ModelConfig(name="cnn")
    probe = onnx.load(LoadContext("cnn", 1, model_file, config, RuntimeOptions()))
    config = complete_config(config, platform="onnxruntime_onnx", backend="onnxruntime",
                             default_filename="model.onnx", inputs=probe.inputs(), outputs=probe.outputs())
    probe.close()
    for key, value in row["parameters"].items():
        config.parameters[key].string_value = value
    info = named(row["backend"])
    instances = [info.load(LoadContext("cnn", 1, model_file, config, RuntimeOptions(), index, row["threads"]))
                 for index in range(row["instances"])]
    return instances, config


def _latency_ms(backend: Backend, x: dict, seconds: float) -> float:
    for _ in range(5):
        backend.run(x, ["logits"])
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        begin = time.perf_counter()
        backend.run(x, ["logits"])
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1000


def _items_per_s(instances: list[Backend], x: dict, batch: int, clients: int, seconds: float) -> float:
    """``clients`` threads, each taking a free instance, running one batch and giving it back."""
    free: queue.SimpleQueue = queue.SimpleQueue()
    for backend in instances:
        backend.run(x, ["logits"])
        free.put(backend)
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def client(index: int) -> None:
        while time.perf_counter() < stop:
            backend = free.get()
            try:
                backend.run(x, ["logits"])
            finally:
                free.put(backend)
            done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) * batch / (time.perf_counter() - began)


def _measure(model_file: Path, rows: list[dict], seconds: float, repeats: int, clients: int) -> dict[str, tuple]:
    loaded = {row["plan"]: _load(model_file, row) for row in rows}
    rng = np.random.default_rng(0)
    latency: dict[str, list[float]] = {p: [] for p in loaded}
    throughput: dict[str, list[float]] = {p: [] for p in loaded}
    for _ in range(repeats):
        for plan, (instances, config) in loaded.items():
            one = {"image": rng.random((1, 3, 112, 112)).astype(np.float32)}
            top = {"image": rng.random((config.max_batch_size, 3, 112, 112)).astype(np.float32)}
            latency[plan].append(_latency_ms(instances[0], one, seconds))
            throughput[plan].append(_items_per_s(instances, top, config.max_batch_size, clients, seconds))
    for instances, _ in loaded.values():
        for backend in instances:
            backend.close()
    return {p: (statistics.median(latency[p]), statistics.median(throughput[p])) for p in loaded}


def _table(decisions: dict[str, dict], bench: dict[str, tuple], args: argparse.Namespace) -> list[str]:
    chosen_latency, chosen_throughput = decisions["cnn"]["chosen"], decisions["cnn_throughput"]["chosen"]
    tuned = {c["plan"]: c for c in decisions["cnn"]["candidates"]}
    lines = ["Tuner columns: the daemon's measurements while tuning model cnn (cnn_throughput measured the same "
             "candidates again); bench columns: measured separately by this script.", "",
             f"| plan | instances x threads | tuner latency ms (b=1) | tuner items/s (b=max, every instance) | "
             f"bench latency ms (c=1 p50) | bench items/s (c={args.concurrency}) | chosen for |",
             "|---|---|---|---|---|---|---|"]
    for plan, (ms, items) in bench.items():
        row = tuned[plan]
        marks = [objective for objective, chosen in (("latency", chosen_latency), ("throughput", chosen_throughput))
                 if chosen == plan]
        lines.append(f"| {plan} | {row['instances']} x {row['threads']} | {row['latency_ms']:.3f} | "
                     f"{row['throughput']:.1f} | {ms:.3f} | {items:.1f} | {', '.join(marks)} |")
    for row in decisions["cnn"]["candidates"]:
        if row["status"] != "ok":
            lines.append(f"| {row['plan']} | | {row['status']}: {row.get('reason', '')} | | | | |")
    fastest = min(bench, key=lambda p: bench[p][0])
    busiest = max(bench, key=lambda p: bench[p][1])
    lines += [
        "",
        f"latency: chosen {chosen_latency} {bench[chosen_latency][0]:.3f} ms vs best in the bench {fastest} "
        f"{bench[fastest][0]:.3f} ms -> {bench[chosen_latency][0] / bench[fastest][0]:.3f}x (target <= 1.05x)",
        f"throughput: chosen {chosen_throughput} {bench[chosen_throughput][1]:.1f} items/s vs best in the bench "
        f"{busiest} {bench[busiest][1]:.1f} items/s -> {bench[chosen_throughput][1] / bench[busiest][1]:.3f} of the "
        f"best (target >= 0.95)",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        repo, state = Path(tmp) / "repo", Path(tmp) / "state"
        model_file = _write_repository(repo)
        cold, decisions = _start_timed(repo, state)
        warm, warm_decisions = _start_timed(repo, state)
        ok = [c for c in decisions["cnn"]["candidates"] if c["status"] == "ok"]
        bench = _measure(model_file, ok, args.seconds, args.repeats, args.concurrency)
    lines = _table(decisions, bench, args)
    lines.append(f"time to ready (2 models): cold (tuning, cache {decisions['cnn']['cache']}) {cold:.2f} s; "
                 f"warm (cache {warm_decisions['cnn']['cache']}) {warm:.2f} s")
    # Another process on the box takes a core from the 2-thread plans: say how busy the box was.
    lines.append(f"1-minute load average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
                 f"({os.cpu_count()} cores; this benchmark alone adds up to about 2)")
    text = "\n".join(lines)
    print(text)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "selection.md").write_text(f"Command: python -m bench.selection --seconds {args.seconds:g} --repeats "
                                      f"{args.repeats} --concurrency {args.concurrency}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
