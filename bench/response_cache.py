"""Response cache benchmark: a camera-like stream of frames, with the cache on and off.

Run: python -m bench.response_cache [--seconds 4] [--repeats 3] [--concurrency 1,4]
                                   [--out bench/results/response-cache.md]

One daemon (``--cache-config local,size=256 MiB``) serves the same ONNX model twice: ``camera_cached``
(``response_cache { enable: true }``) and ``camera`` (no cache), so every series runs against the same
process and the on/off ratios compare like with like. The model is a small CNN over a 3x224x224 FP32 frame
(four strided 3x3 convolutions of 32 to 256 channels, about 185 M multiply-adds: lighter than a
MobileNetV2) sent as 602 KB of binary data over HTTP, as a camera client sends it. wrk drives the streams
(closed loop, keep-alive connections), choosing each request's frame in Lua:

- 50 % repeated: each request repeats the previous frame with probability 0.5, else sends a frame never
  seen before (a unique counter stamped into its pixels);
- repeated half: every request repeats the previous frame (the repeated half of that stream, alone);
- 0 % repeated: every frame is new (every request misses: what the cache costs when it never helps).

Targets (issue 26): >= 1.8x throughput on the repeated half with the cache on; <= 3 % lower throughput on the
0 % stream. Series are interleaved and repeated, on and off back to back in alternating order; medians are
reported with the load average, since the machine may be shared. The core series add CPU-time figures,
which the box's other load does not inflate.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.loadgen import Result, run_wrk
from bench.process import start_appliance

FRAME = (3, 224, 224)
WIDTHS = (32, 64, 128, 256)
"""Channels of the strided convolutions: about 185 M multiply-adds per frame (MobileNetV2 at 224: 300 M)."""
CACHE_BYTES = 256 * 1024 * 1024
STREAMS = {"50 % repeated": 0.5, "repeated half": 1.0, "0 % repeated": 0.0}
MODELS = {"on": "camera_cached", "off": "camera"}
SPEEDUP_TARGET = 1.8
COST_TARGET = 0.03


def camera_model(seed: int = 0) -> onnx.ModelProto:
    """frame [batch, 3, 224, 224] -> scores [batch, 100]: strided 3x3 convolutions, pooled, a dense layer."""
    rng = np.random.default_rng(seed)
    nodes, initializers, channels, previous = [], [], 3, "frame"
    for index, width in enumerate(WIDTHS):
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


# wrk's request(): a frame is the previous one again with probability REPEAT, else one never sent before
# (the series' number and a counter written over its first pixels); a repeated frame resends the very
# same request bytes.
_STREAM_LUA = """
local repeat_p, stamp, series = {repeat}, {stamp}, {series}
local prefix, suffix = wrk.body:sub(1, stamp), wrk.body:sub(stamp + 9)
local count, last = 0, nil
math.randomseed({seed})
request = function()
  if last == nil or math.random() >= repeat_p then
    count = count + 1
    last = wrk.format(nil, nil, nil, prefix .. string.format("%04x%04x", series, count % 65536) .. suffix)
  end
  return last
end
"""


def frame_request(seed: int = 0) -> tuple[bytes, dict[str, str], int]:
    """One frame as tritonclient sends it (binary data after a JSON header): body, headers, and where the
    frame's bytes start."""
    pixels = np.random.default_rng(seed).random((1, *FRAME), np.float32)
    header = json.dumps({"inputs": [{"name": "frame", "shape": [1, *FRAME], "datatype": "FP32",
                                     "parameters": {"binary_data_size": pixels.nbytes}}],
                         "outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + pixels.tobytes(), headers, len(header)


def run_series(base: str, model: str, repeat: float, concurrency: int, seconds: float, series: int) -> Result:
    """wrk on one model for ``seconds``: a stream whose frames repeat with probability ``repeat``."""
    body, headers, stamp = frame_request()
    lua = _STREAM_LUA.format(repeat=repeat, stamp=stamp, series=series % 65536, seed=series)
    return run_wrk(f"{base}/v2/models/{model}/infer", body, headers, concurrency, seconds, lua)


def measure(repo: Path, state: Path, args: argparse.Namespace) -> dict[tuple[str, str, int], dict[str, float]]:
    server = start_appliance(repo, state, "--no-selection", "--no-grpc", "--cache-config", f"local,size={CACHE_BYTES}")
    raw: dict[tuple[str, str, int], list[Result]] = {}
    series = itertools.count(1)
    try:
        for model in MODELS.values():  # warm-up: the first requests pay for lazy set-up
            run_series(server.base, model, 0.5, 1, 1.0, next(series))
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                for stream, probability in STREAMS.items():
                    # On and off back to back, so the same load falls on both; which goes first alternates (the
                    # first of a pair runs measurably faster here, whichever it is).
                    pair = list(MODELS.items())
                    for cache, model in pair if repeat % 2 == 0 else reversed(pair):
                        result = run_series(server.base, model, probability, concurrency, args.seconds,
                                            next(series))
                        raw.setdefault((stream, cache, concurrency), []).append(result)
                        print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency} {stream:14} cache {cache:3} "
                              f"{result.requests_per_s:8.1f} req/s p50 {result.p50_ms:.2f} ms", file=sys.stderr)
        statistics_of = _statistics(server.port)
    finally:
        server.stop()
    medians = {key: {"rps": statistics.median(r.requests_per_s for r in results),
                     "p50": statistics.median(r.p50_ms for r in results),
                     "p99": statistics.median(r.p99_ms for r in results),
                     "errors": sum(r.errors for r in results)} for key, results in raw.items()}
    medians[("cache", "hits", 0)] = statistics_of
    return medians


async def _core(repo: Path, requests: int, repeats: int) -> dict[str, float]:
    """CPU µs per request in the core (``ModelVersion.infer`` one request at a time, no transport): a new
    frame with the cache off (what a miss costs anyway) and a repeated frame with the cache on (a hit), as
    the whole process's CPU time (the runtime's threads included); and the cache's own work on a miss
    (the key over the frame and the insertion, the thread's CPU time). CPU time, unlike the wall clock,
    does not grow when other processes share the box."""
    from appliance.backends import RuntimeOptions
    from appliance.engine.response_cache import ResponseCache, request_key
    from appliance.engine.server_wide import ServerWide
    from appliance.engine.types import InferInput, InferRequest
    from appliance.repository.registry import ModelRegistry

    cache = ResponseCache(CACHE_BYTES)
    registry = ModelRegistry(repo, RuntimeOptions(), drain_timeout=5, server=ServerWide(response_cache=cache))
    await registry.load_all()
    frame = np.random.default_rng(1).random((1, *FRAME), np.float32)
    counter = itertools.count(1)
    medians: dict[str, list[float]] = {"miss, cache off": [], "hit, cache on": [], "the cache's work on a miss": []}
    try:
        for _ in range(repeats):
            for case, name, new in (("miss, cache off", MODELS["off"], True), ("hit, cache on", MODELS["on"], False)):
                model = registry.get(name)
                await model.infer(InferRequest([InferInput("frame", "FP32", frame.copy())]))  # the frame to hit
                times = []
                for _ in range(requests):
                    if new:
                        frame[0, 0, 0, 0] = next(counter)
                    request = InferRequest([InferInput("frame", "FP32", frame.copy())])
                    started = time.process_time()
                    outputs = await model.infer(request)
                    times.append((time.process_time() - started) * 1e6)
                medians[case].append(statistics.mean(times))
            owner, work = ResponseCache.owner(), []
            kept = {o.name: o.data for o in outputs.outputs}
            for _ in range(requests):
                frame[0, 0, 0, 0] = next(counter)
                started = time.thread_time()
                key = request_key(owner, [InferInput("frame", "FP32", frame)], ["scores"])
                cache.lookup(key)
                cache.insert(key, owner, kept)
                work.append((time.thread_time() - started) * 1e6)
            cache.forget(owner)
            medians["the cache's work on a miss"].append(statistics.mean(work))
    finally:
        await registry.close(10)
    return {case: statistics.median(values) for case, values in medians.items()}


def _statistics(port: int) -> dict[str, float]:
    """The cached model's own account of the run (Triton's statistics extension): hits, misses, and the
    mean time of each (the cache's lookup, or lookup and insertion) against the mean request."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODELS['on']}/stats", timeout=10) as answer:
        inference = json.load(answer)["model_stats"][0]["inference_stats"]

    def mean_us(entry: dict) -> float:
        return entry["ns"] / entry["count"] / 1000 if entry["count"] else float("nan")

    return {"hits": inference["cache_hit"]["count"], "misses": inference["cache_miss"]["count"],
            "hit_us": mean_us(inference["cache_hit"]), "miss_us": mean_us(inference["cache_miss"]),
            "request_us": mean_us(inference["success"])}


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(results: dict, core: dict[str, float], args: argparse.Namespace,
           load: tuple[list[float], list[float]]) -> str:
    hits = results.pop(("cache", "hits", 0))
    lines = [f"Command: python -m bench.response_cache --seconds {args.seconds} --repeats {args.repeats} "
             f"--concurrency {','.join(map(str, args.concurrency))}", "",
             f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load[0])}; after: "
             f"{', '.join(f'{v:.2f}' for v in load[1])} on {os.cpu_count()} CPUs (shared machine; on and off run "
             "back to back in every repeat, first one then the other).", "",
             f"Frames: FP32 {'x'.join(map(str, FRAME))} ({int(np.prod(FRAME)) * 4 // 1000} KB) as binary data over "
             "HTTP (wrk, one thread); medians of repeats.", "",
             f"The cached model's statistics over the run: {int(hits['hits'])} hits ({hits['hit_us']:.0f} µs each "
             f"on average, the lookup), {int(hits['misses'])} misses ({hits['miss_us']:.0f} µs each, lookup and "
             f"insertion), against {hits['request_us']:.0f} µs per request on average.", "",
             "| stream | c | cache | req/s | p50 ms | p99 ms | errors (wrk: non-2xx, or over its 2 s timeout) |",
             "|---|---|---|---|---|---|---|"]
    for concurrency in args.concurrency:
        for stream in STREAMS:
            for cache in MODELS:
                m = results[(stream, cache, concurrency)]
                lines.append(f"| {stream} | {concurrency} | {cache} | {m['rps']:.1f} | {m['p50']:.2f} | "
                             f"{m['p99']:.2f} | {int(m['errors'])} |")
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
    off, work, hit = core["miss, cache off"], core["the cache's work on a miss"], core["hit, cache on"]
    lines += ["", "## In the core (ModelVersion.infer, no transport; CPU µs per request, mean of "
              f"{args.core_requests}, median of repeats)", "", "| case | CPU µs per request |", "|---|---|",
              *(f"| {case} | {value:.0f} |" for case, value in core.items()), "",
              "| figure | measured | target |", "|---|---|---|",
              f"| what the cache adds to a miss: its work / a miss's CPU | {work / off:+.1%} | "
              f"<= {COST_TARGET:.0%}: {_mark(work / off <= COST_TARGET)} |",
              f"| a repeated frame, CPU off / CPU hit | {off / hit:.1f}x | >= {SPEEDUP_TARGET}x: "
              f"{_mark(off / hit >= SPEEDUP_TARGET)} |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4])
    parser.add_argument("--core-requests", type=int, default=100, help="requests per case in the core series")
    parser.add_argument("--out", type=Path, default=Path("bench/results/response-cache.md"))
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        core = asyncio.run(_core(repo, args.core_requests, args.repeats))
        results = measure(repo, Path(tmp) / "state", args)
    text = report(results, core, args, (load_before, list(os.getloadavg())))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Response cache\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
