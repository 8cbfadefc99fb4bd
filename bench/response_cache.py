"""Response cache benchmark: a camera-like stream of frames, with the cache on and off.

Run: python -m bench.response_cache [--seconds 4] [--repeats 3] [--concurrency 1,4]
                                   [--out bench/results/response-cache.md]

One daemon (``--cache-config local,size=256 MiB``) serves the same ONNX model twice: ``camera_cached``
(``response_cache { enable: true }``) and ``camera`` (no cache), so every series runs against the same
process and the on/off ratios compare like with like. The model is a small CNN over a 3x224x224 FP32 frame
(three strided 3x3 convolutions of 32, 64 and 128 channels, about 120 M multiply-adds: lighter than a
MobileNet) sent as 602 KB of binary data over HTTP, as a camera client sends it. Clients are closed-loop threads on
keep-alive connections; each keeps its own "previous frame":

- 50 % repeated: each request repeats the client's previous frame with probability 0.5, else sends a frame
  never seen before (a unique counter stamped into its pixels);
- repeated half: every request repeats the previous frame (the repeated half of that stream, alone);
- 0 % repeated: every frame is new (every request misses: what the cache costs when it never helps).

Targets (issue 26): >= 1.8x throughput on the repeated half with the cache on; <= 3 % lower throughput on the
0 % stream. Series are interleaved and repeated; medians are reported with the load average, since the
machine may be shared.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.process import start_appliance

FRAME = (3, 224, 224)
CACHE_BYTES = 256 * 1024 * 1024
STREAMS = {"50 % repeated": 0.5, "repeated half": 1.0, "0 % repeated": 0.0}
MODELS = {"on": "camera_cached", "off": "camera"}
SPEEDUP_TARGET = 1.8
COST_TARGET = 0.03


def camera_model(seed: int = 0) -> onnx.ModelProto:
    """frame [batch, 3, 224, 224] -> scores [batch, 100]: three strided 3x3 convolutions, pooled, a dense layer."""
    rng = np.random.default_rng(seed)
    nodes, initializers, channels, previous = [], [], 3, "frame"
    for index, width in enumerate((32, 64, 128)):
        weights = (rng.standard_normal((width, channels, 3, 3)) * 0.2).astype(np.float32)
        initializers += [numpy_helper.from_array(weights, f"w{index}"),
                         numpy_helper.from_array(np.zeros(width, np.float32), f"b{index}")]
        nodes += [helper.make_node("Conv", [previous, f"w{index}", f"b{index}"], [f"c{index}"], kernel_shape=[3, 3],
                                   pads=[1, 1, 1, 1], strides=[2, 2]),
                  helper.make_node("Relu", [f"c{index}"], [f"r{index}"])]
        previous, channels = f"r{index}", width
    initializers += [numpy_helper.from_array((rng.standard_normal((channels, 100)) * 0.2).astype(np.float32), "dw"),
                     numpy_helper.from_array(np.zeros(100, np.float32), "db")]
    nodes += [helper.make_node("GlobalAveragePool", [previous], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "dw", "db"], ["scores"])]
    graph = helper.make_graph(nodes, "camera",
                              [helper.make_tensor_value_info("frame", TensorProto.FLOAT, ["batch", *FRAME])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 100])],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_repository(root: Path) -> Path:
    model = camera_model()
    for name in MODELS.values():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        cache = "response_cache { enable: true }\n" if name == MODELS["on"] else ""
        (root / name / "config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + cache
            + 'input [ { name: "frame" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]\n'
            + 'output [ { name: "scores" data_type: TYPE_FP32 dims: [ 100 ] } ]\n')
    return root


class Stream:
    """One client's frames: the previous one again with probability ``repeat``, else a frame never sent."""

    _counter = iter(range(1, 1 << 62))
    _lock = threading.Lock()

    def __init__(self, repeat: float, seed: int) -> None:
        self.repeat = repeat
        self._random = random.Random(seed)
        pixels = np.random.default_rng(seed).random((1, *FRAME), np.float32)
        header = json.dumps({"inputs": [{"name": "frame", "shape": [1, *FRAME], "datatype": "FP32",
                                         "parameters": {"binary_data_size": pixels.nbytes}}],
                             "outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}).encode()
        self.headers = {"Inference-Header-Content-Length": str(len(header)),
                        "Content-Type": "application/octet-stream"}
        self._body = bytearray(header + pixels.tobytes())
        self._stamp = len(header)  # the first pixels carry the frame's number
        self._new_frame()

    def _new_frame(self) -> None:
        with Stream._lock:
            number = next(Stream._counter)
        self._body[self._stamp:self._stamp + 8] = np.array([number], np.float64).tobytes()
        self.body = bytes(self._body)

    def next(self) -> bool:
        """Advance to the next frame; True when it repeats the previous one."""
        if self._random.random() < self.repeat:
            return True
        self._new_frame()
        return False


def run_series(port: int, model: str, repeat: float, concurrency: int, seconds: float,
               seed: int) -> dict[str, float]:
    """Closed-loop clients for ``seconds``: req/s, p50 (ms), and the p50 of repeated and of new frames."""
    path = f"/v2/models/{model}/infer"
    deadline = time.monotonic() + seconds
    results: list[list[tuple[float, bool]]] = [[] for _ in range(concurrency)]
    errors: list[str] = []

    def client(index: int) -> None:
        stream = Stream(repeat, seed * 1000 + index)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        first = True
        try:
            while time.monotonic() < deadline:
                repeated = stream.next() and not first
                first = False
                start = time.perf_counter()
                connection.request("POST", path, body=stream.body, headers=stream.headers)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                    return
                results[index].append((time.perf_counter() - start, repeated))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    every = [entry for per_client in results for entry in per_client]

    def p50(values: list[float]) -> float:
        return statistics.median(values) * 1000 if values else float("nan")

    return {"rps": len(every) / elapsed, "p50": p50([t for t, _ in every]),
            "p50_repeated": p50([t for t, r in every if r]), "p50_new": p50([t for t, r in every if not r])}


def measure(repo: Path, state: Path, args: argparse.Namespace) -> dict[tuple[str, str, int], dict[str, float]]:
    server = start_appliance(repo, state, "--no-selection", "--no-grpc", "--cache-config", f"local,size={CACHE_BYTES}")
    raw: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        for model in MODELS.values():  # warm-up: the first requests pay for lazy set-up
            run_series(server.port, model, 0.5, 1, 1.0, seed=99)
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                for stream, probability in STREAMS.items():
                    for cache, model in MODELS.items():  # on and off back to back: the same load on both
                        result = run_series(server.port, model, probability, concurrency, args.seconds,
                                            seed=repeat * 10 + concurrency)
                        raw.setdefault((stream, cache, concurrency), []).append(result)
                        print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency} {stream:14} cache {cache:3} "
                              f"{result['rps']:8.1f} req/s p50 {result['p50']:.2f} ms", file=sys.stderr)
    finally:
        server.stop()
    return {key: {name: statistics.median(r[name] for r in results) for name in results[0]}
            for key, results in raw.items()}


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(results: dict, args: argparse.Namespace, load: tuple[list[float], list[float]]) -> str:
    lines = [f"Command: python -m bench.response_cache --seconds {args.seconds} --repeats {args.repeats} "
             f"--concurrency {','.join(map(str, args.concurrency))}", "",
             f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load[0])}; after: "
             f"{', '.join(f'{v:.2f}' for v in load[1])} on {os.cpu_count()} CPUs (shared machine; on and off run "
             "back to back in every repeat).", "",
             f"Frames: FP32 {'x'.join(map(str, FRAME))} ({int(np.prod(FRAME)) * 4 // 1000} KB) as binary data over "
             "HTTP; medians of repeats.", "",
             "| stream | c | cache | req/s | p50 ms | p50 repeated frames ms | p50 new frames ms |",
             "|---|---|---|---|---|---|---|"]
    for concurrency in args.concurrency:
        for stream in STREAMS:
            for cache in MODELS:
                m = results[(stream, cache, concurrency)]
                lines.append(f"| {stream} | {concurrency} | {cache} | {m['rps']:.1f} | {m['p50']:.2f} | "
                             f"{m['p50_repeated']:.2f} | {m['p50_new']:.2f} |")
    lines += ["", "| target | c | measured | verdict |", "|---|---|---|---|"]
    def ratio(stream: str, concurrency: int) -> float:
        return results[(stream, "on", concurrency)]["rps"] / results[(stream, "off", concurrency)]["rps"]

    for concurrency in args.concurrency:
        speedup, mixed = ratio("repeated half", concurrency), ratio("50 % repeated", concurrency)
        cost = 1 - ratio("0 % repeated", concurrency)
        lines += [f"| throughput on the repeated half, cache on / off >= {SPEEDUP_TARGET}x | {concurrency} | "
                  f"{speedup:.2f}x | {_mark(speedup >= SPEEDUP_TARGET)} |",
                  f"| cost on the 0 % repeated stream <= {COST_TARGET:.0%} | {concurrency} | {cost:+.1%} | "
                  f"{_mark(cost <= COST_TARGET)} |",
                  f"| (the 50 % stream as a whole, cache on / off) | {concurrency} | {mixed:.2f}x | — |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4])
    parser.add_argument("--out", type=Path, default=Path("bench/results/response-cache.md"))
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        results = measure(repo, Path(tmp) / "state", args)
    text = report(results, args, (load_before, list(os.getloadavg())))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Response cache\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
