"""Serving benchmark: the appliance over HTTP JSON, HTTP binary and gRPC, against the Python floor and
against onnxruntime in-process.

    python -m bench.serving [--seconds 4] [--repeats 3] [--concurrency 1,4,8,16]   (or: make bench)

Starts the daemon (127.0.0.1, ephemeral ports, mDNS off) and a bare aiohttp handler (orjson-parse +
onnxruntime + orjson-dump: the floor), drives the HTTP series with wrk and the gRPC series with h2load
(HTTP/2 POSTs of one ModelInferRequest, as a gRPC client sends it) on loopback, interleaving the series
each repeat, and prints one table of medians with the ratios; writes the table, JSON and a throughput
plot to bench/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2 as pb

from bench.loadgen import Result, add_wrk_arguments, grpc_frame, require_h2load, require_wrk, run_h2load, run_wrk
from bench.models import write_repository
from bench.process import start_appliance, start_floor

RESULTS = Path(__file__).parent / "results"
BATCHES = (1, 2, 4, 8, 16, 32)


_TINY = ("input", "probabilities", np.random.default_rng(0).random((1, 784)).astype(np.float32))
_CNN = ("image", "logits", np.random.default_rng(1).random((1, 3, 112, 112)).astype(np.float32))
_IDENTITY = ("INPUT0", "OUTPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))
_JSON = {"Content-Type": "application/json"}


def _json_body(tensor: tuple[str, str, np.ndarray]) -> bytes:
    name, _, x = tensor
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "data": [float(v) for v in x.ravel()]}]}).encode()


def _binary_body(tensor: tuple[str, str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    name, output, x = tensor
    header = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}


def _grpc_body(model: str, tensor: tuple[str, str, np.ndarray]) -> bytes:
    """What tritonclient.grpc sends: the input as raw_input_contents, the output asked for by name."""
    name, output, x = tensor
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=list(x.shape))],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=output)],
        raw_input_contents=[x.tobytes()],
    )
    return grpc_frame(request.SerializeToString())


def in_process_rates(session: ort.InferenceSession, seconds: float) -> dict[int, float]:
    """onnxruntime in this process: items/s per batch size, one pass (run once per repeat, between the
    series, so that it sees the same load on the box as they do)."""
    rates: dict[int, float] = {}
    for batch in BATCHES:
        x = np.random.default_rng(2).random((batch, 3, 112, 112)).astype(np.float32)
        session.run(None, {"image": x})
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(None, {"image": x})
            count += batch
        rates[batch] = count / (time.perf_counter() - start)
    return rates


def _in_process_best(passes: list[dict[int, float]]) -> dict:
    rates = {batch: statistics.median(p[batch] for p in passes) for batch in BATCHES}
    best = max(rates, key=rates.__getitem__)
    return {"best_batch": best, "items_per_s": rates[best], "by_batch": rates}


def _stats(base: str, model: str) -> dict:
    with urllib.request.urlopen(f"{base}/v2/models/{model}/stats", timeout=10) as response:
        return json.load(response)["model_stats"][0]


def _histogram(stats: dict) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def _delta(after: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def _median(results: list[Result]) -> dict[str, float]:
    return {
        "rps": statistics.median(r.requests_per_s for r in results),
        "p50": statistics.median(r.p50_ms for r in results),
        "p99": statistics.median(r.p99_ms for r in results),
        "errors": sum(r.errors for r in results),
    }


def _run(series: tuple, base: str, concurrency: int, seconds: float) -> tuple[Result, dict]:
    """One run of a series; the model's statistics before and after (empty for the floor)."""
    protocol, url, body, headers, model = series
    before = _stats(base, model) if model else {}
    if protocol == "grpc":
        result, done = run_h2load(url, body, concurrency, seconds)
        after = _stats(base, model)
        # gRPC's errors travel in trailers: a call that did not succeed in the model is an error.
        served = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        result = dataclasses.replace(result, errors=result.errors + max(0, done - served))
    else:
        result = run_wrk(url, body, headers, concurrency, seconds)
        after = _stats(base, model) if model else {}
    return result, {"before": before, "after": after}


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    repo = write_repository(workdir / "repo")
    appliance = start_appliance(repo, workdir / "state")
    floor = start_floor(repo / "tiny" / "1" / "model.onnx")
    floor_off = start_floor(repo / "tiny" / "1" / "model.onnx", "--off-loop")
    try:
        tiny = _json_body(_TINY)
        tiny_binary, binary_headers = _binary_body(_TINY)
        cnn, cnn_headers = _binary_body(_CNN)
        v2, grpc_url = f"{appliance.base}/v2/models", f"http://127.0.0.1:{appliance.grpc_port}"
        infer_rpc = f"{grpc_url}/inference.GRPCInferenceService/ModelInfer"
        series = {
            "appliance tiny JSON": ("http", f"{v2}/tiny/infer", tiny, _JSON, "tiny"),
            "appliance tiny binary": ("http", f"{v2}/tiny/infer", tiny_binary, binary_headers, "tiny"),
            "appliance tiny gRPC": ("grpc", infer_rpc, _grpc_body("tiny", _TINY), {}, "tiny"),
            "floor tiny JSON": ("http", f"{floor.base}/infer", tiny, _JSON, None),
            "floor tiny JSON, inference off the loop": ("http", f"{floor_off.base}/infer", tiny, _JSON, None),
            "appliance CNN JSON, batching": ("http", f"{v2}/cnn_batched/infer", _json_body(_CNN), _JSON,
                                             "cnn_batched"),
            "appliance CNN binary, batching": ("http", f"{v2}/cnn_batched/infer", cnn, cnn_headers, "cnn_batched"),
            "appliance CNN gRPC, batching": ("grpc", infer_rpc, _grpc_body("cnn_batched", _CNN), {}, "cnn_batched"),
            "appliance CNN binary, no batching": ("http", f"{v2}/cnn_plain/infer", cnn, cnn_headers, "cnn_plain"),
            "appliance identity ONNX JSON": ("http", f"{v2}/identity_onnx/infer", _json_body(_IDENTITY), _JSON,
                                             "identity_onnx"),
            "appliance identity Python JSON": ("http", f"{v2}/identity_python/infer", _json_body(_IDENTITY), _JSON,
                                               "identity_python"),
        }
        raw: dict[str, dict[int, list[Result]]] = {name: {c: [] for c in args.concurrency} for name in series}
        loads: list[float] = []
        session = ort.InferenceSession(str(repo / "cnn_plain" / "1" / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        passes: list[dict[int, float]] = []
        histograms: dict[str, dict[int, dict[int, int]]] = {name: {} for name in series}
        for entry in series.values():  # warm-up: first requests pay for lazy set-up
            _run(entry, appliance.base, 2, 1)
        for repeat in range(args.repeats):
            passes.append(in_process_rates(session, args.seconds / 4))
            for concurrency in args.concurrency:
                for name, entry in series.items():
                    result, stats = _run(entry, appliance.base, concurrency, args.seconds)
                    raw[name][concurrency].append(result)
                    loads.append(os.getloadavg()[0])
                    if entry[-1] and repeat == args.repeats - 1:
                        histograms[name][concurrency] = _delta(_histogram(stats["after"]),
                                                               _histogram(stats["before"]))
                    print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency:<3} {name:40} "
                          f"{result.requests_per_s:9.1f} req/s  load {loads[-1]:.2f}", file=sys.stderr)
        features = _features_on(appliance.base)
    finally:
        appliance.stop()
        floor.stop()
        floor_off.stop()
    return {
        "series": {n: {c: _median(r) for c, r in by_c.items()} for n, by_c in raw.items()},
        "histograms": histograms,
        "in_process": _in_process_best(passes),
        "settings": {"seconds": args.seconds, "repeats": args.repeats, "concurrency": args.concurrency},
        "machine": machine(),
        "load_average": {"median": statistics.median(loads), "min": min(loads), "max": max(loads)},
        "features": features,
    }


def machine() -> str:
    """What the figures were measured on: the CPU model, the cores this process may use, the kernel."""
    model, virtual = platform.processor() or platform.machine(), False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                virtual = " hypervisor" in line
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    return (f"{model}, {cores} cores{' (virtual machine)' if virtual else ''}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def _features_on(base: str) -> dict[str, bool]:
    """What stayed on while measuring: statistics counted the requests, /metrics answered, and the
    auth and in-flight limits are the daemon's defaults (nothing was switched off on its command line)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        metrics = response.status == 200
    statistics_on = _stats(base, "tiny")["inference_stats"]["success"]["count"] > 0
    return {"statistics": statistics_on, "metrics": metrics, "default settings (auth, limits, history)": True}


def table(data: dict) -> str:
    s = data["series"]
    best = data["in_process"]["items_per_s"]
    lines = ["| series | c | req/s (items/s) | p50 ms | p99 ms | errors | ratio | batch sizes (count) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by_c in s.items():
        for c, m in by_c.items():
            if name == "appliance tiny JSON":
                off = s["floor tiny JSON, inference off the loop"][c]["rps"]
                ratio = f"{m['rps'] / s['floor tiny JSON'][c]['rps']:.2f}× floor, {m['rps'] / off:.2f}× off-loop floor"
            elif name == "floor tiny JSON, inference off the loop":
                ratio = f"{m['rps'] / s['floor tiny JSON'][c]['rps']:.2f}× floor"
            elif name == "appliance CNN binary, batching":
                plain = s["appliance CNN binary, no batching"][c]["rps"]
                ratio = f"{m['rps'] / best:.2f}× in-process best, {m['rps'] / plain:.2f}× no batching"
            elif name == "appliance CNN binary, no batching":
                ratio = f"{m['rps'] / best:.2f}× in-process best"
            elif name == "appliance identity Python JSON":
                onnx = s["appliance identity ONNX JSON"][c]
                ratio = f"{m['rps'] / onnx['rps']:.2f}× ONNX identity, p50 +{(m['p50'] - onnx['p50']) * 1000:.0f} µs"
            elif name == "appliance identity ONNX JSON":
                ratio = f"{m['rps'] / s['appliance tiny JSON'][c]['rps']:.2f}× tiny JSON"
            elif name.startswith("appliance tiny"):
                ratio = (f"{m['rps'] / s['appliance tiny binary'][c]['rps']:.2f}× tiny binary, "
                         f"{m['rps'] / s['appliance tiny JSON'][c]['rps']:.2f}× tiny JSON")
            elif name.startswith("appliance CNN"):
                ratio = (f"{m['rps'] / best:.2f}× in-process best, "
                         f"{m['rps'] / s['appliance CNN binary, batching'][c]['rps']:.2f}× CNN binary")
            else:
                ratio = "1.00 (floor)"
            hist = data["histograms"].get(name, {}).get(c, {})
            hist_text = " ".join(f"{k}:{v}" for k, v in hist.items()) or "-"
            lines.append(f"| {name} | {c} | {m['rps']:.1f} | {m['p50']:.2f} | {m['p99']:.2f} | "
                         f"{m['errors']} | {ratio} | {hist_text} |")
    ip = data["in_process"]
    per_batch = ", ".join(f"b{b}: {r:.0f}" for b, r in ip["by_batch"].items())
    lines.append(f"| onnxruntime in-process CNN, best batch {ip['best_batch']} | - | {best:.1f} | - | - | - | "
                 f"physical limit ({per_batch}) | - |")
    return "\n".join(lines)


def targets(data: dict) -> list[str]:
    """The request-path targets (issue 17), each met or missed, from the medians of this one run."""
    s = data["series"]
    cs = data["settings"]["concurrency"]
    lo, hi = min(cs), max(cs)
    ip = data["in_process"]
    checks = []
    for c in (lo, hi):
        ratio = s["appliance tiny JSON"][c]["rps"] / s["floor tiny JSON"][c]["rps"]
        checks.append((f"tiny JSON c={c} >= 0.9x bare handler", ratio >= 0.9, f"{ratio:.2f}x"))
    for c in (lo, hi):
        ratio = s["appliance tiny gRPC"][c]["rps"] / s["appliance tiny JSON"][c]["rps"]
        checks.append((f"tiny gRPC c={c} >= tiny HTTP JSON", ratio >= 1.0, f"{ratio:.2f}x"))
    ratio = s["appliance CNN binary, batching"][hi]["rps"] / ip["items_per_s"]
    checks.append((f"CNN binary, batching, c={hi} >= 0.9x in-process best batch", ratio >= 0.9, f"{ratio:.2f}x"))
    batch1_ms = 1000 / ip["by_batch"][1]
    bound = 1.1 * (batch1_ms + s["floor tiny JSON"][lo]["p50"])
    p50 = s["appliance CNN binary, batching"][lo]["p50"]
    checks.append((f"CNN binary, batching, c={lo} p50 within 10% of in-process batch-1 latency + bare handler p50",
                   p50 <= bound, f"{p50:.2f} ms vs {bound:.2f} ms = 1.1 x ({batch1_ms:.2f} + "
                   f"{s['floor tiny JSON'][lo]['p50']:.2f})"))
    added = (s["appliance identity Python JSON"][lo]["p50"] - s["appliance identity ONNX JSON"][lo]["p50"]) * 1000
    checks.append((f"empty Python model c={lo} p50 <= 150 us over the ONNX identity", added <= 150,
                   f"+{added:.0f} us"))
    off = [name for name, on in data["features"].items() if not on]
    checks.append(("nothing switched off (auth, limits, statistics, metrics history)", not off,
                   "all on" if not off else f"off: {', '.join(off)}"))
    return [f"- {'met' if ok else 'MISSED'}: {what} ({value})" for what, ok, value in checks]


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, by_c in data["series"].items():
        ax = axes[0] if "tiny" in name or "identity" in name else axes[1]
        cs = sorted(by_c)
        ax.plot(cs, [by_c[c]["rps"] for c in cs], marker="o", label=name)
    axes[1].axhline(data["in_process"]["items_per_s"], color="grey", linestyle="--",
                    label=f"onnxruntime in-process, batch {data['in_process']['best_batch']}")
    for ax, title in zip(axes, ("tiny MLP and identity models", "CNN 3x112x112")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (loopback, wrk)")
        ax.set_ylabel("requests/s (= items/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wrk_arguments(parser, (1, 4, 8, 16))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    require_h2load()
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(args, Path(tmp))
    load = data["load_average"]
    text = (f"Machine: {data['machine']}; shared with other work: 1-minute load average {load['median']:.2f} "
            f"(median; {load['min']:.2f}-{load['max']:.2f}) over the runs\n\n"
            + table(data) + "\n\nTargets (issue 17):\n" + "\n".join(targets(data)))
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving.md").write_text(
        f"Command: python -m bench.serving --seconds {args.seconds:g} --repeats {args.repeats} "
        f"--concurrency {','.join(map(str, args.concurrency))}\n\n{text}\n"
    )
    (args.out / "serving.json").write_text(json.dumps(data, indent=2, default=str))
    try:
        plot(data, args.out / "serving.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
