"""Ensemble benchmark: what an ensemble adds per step, against calling its ONNX model directly.

Run: python -m bench.ensemble [--seconds 3] [--repeats 5] [--concurrency 1,16] [--out bench/results/ensemble.md]

Two measurements, medians of repeats:
- over HTTP (wrk, binary tensors, 127.0.0.1): the ONNX model direct, a Python identity direct, the ONNX
  model wrapped in a one-step ensemble, a two-step ONNX -> ONNX ensemble, and the issue's pipeline
  (Python identity -> ONNX);
- in the core (no transport): ``ModelVersion.infer`` on the ONNX model and on the one-step ensemble,
  timed per call on the event loop, which isolates the ensemble's own machinery.

Target (issue 15): <= 150 us added per ensemble step at c=1. The machine may be shared: the load average
is recorded with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.loadgen import Result, run_wrk
from bench.process import start_appliance

TARGET_US = 150.0
WIDTH = 16

_IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
'''

_IO = (f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
       f'output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n')


def _affine() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(np.array([2.0], np.float32), "a"),
                     numpy_helper.from_array(np.array([1.0], np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ensemble(steps: list[str]) -> str:
    """A chain of ``steps`` (models with x -> y) from IN to OUT."""
    tensors = ["IN", *(f"t{i}" for i in range(1, len(steps))), "OUT"]
    entries = ", ".join(
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "x" value: "{tensors[i]}" }} '
        f'output_map {{ key: "y" value: "{tensors[i + 1]}" }} }}' for i, model in enumerate(steps))
    return (f'platform: "ensemble"\nmax_batch_size: 8\n'
            f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            f"ensemble_scheduling {{ step [ {entries} ] }}\n")


ENSEMBLES = {"wrap_onnx": ["onnx"], "onnx_onnx": ["onnx", "onnx"], "identity_onnx": ["identity", "onnx"]}


def write_repository(root: Path) -> Path:
    (root / "onnx" / "1").mkdir(parents=True)
    onnx.save(_affine(), str(root / "onnx" / "1" / "model.onnx"))
    (root / "onnx" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                                                 "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + _IO)
    (root / "identity" / "1").mkdir(parents=True)
    (root / "identity" / "1" / "model.py").write_text(_IDENTITY)
    (root / "identity" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n' + _IO)
    for name, steps in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_ensemble(steps))
    return root


def _body(input_name: str, output_name: str) -> tuple[bytes, dict[str, str]]:
    x = np.linspace(0, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH)
    header = json.dumps({"inputs": [{"name": input_name, "shape": [1, WIDTH], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": output_name, "parameters": {"binary_data": True}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}


SERIES = {  # name -> (model, input, output, steps)
    "ONNX direct": ("onnx", "x", "y", 0),
    "Python identity direct": ("identity", "x", "y", 0),
    "ensemble [ONNX]": ("wrap_onnx", "IN", "OUT", 1),
    "ensemble [ONNX -> ONNX]": ("onnx_onnx", "IN", "OUT", 2),
    "ensemble [Python identity -> ONNX]": ("identity_onnx", "IN", "OUT", 2),
}


def measure_http(repo: Path, state: Path, args: argparse.Namespace) -> dict[str, dict[int, dict[str, float]]]:
    server = start_appliance(repo, state, "--no-selection", "--no-grpc")
    raw: dict[str, dict[int, list[Result]]] = {name: {c: [] for c in args.concurrency} for name in SERIES}
    try:
        bodies = {name: _body(inp, out) for name, (_, inp, out, _) in SERIES.items()}
        url = {name: f"{server.base}/v2/models/{model}/infer" for name, (model, *_) in SERIES.items()}
        for name in SERIES:  # warm-up: first requests pay for lazy set-up
            run_wrk(url[name], *bodies[name], 2, 1)
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                for name in SERIES:  # interleaved, so a burst of load from elsewhere hits every series
                    result = run_wrk(url[name], *bodies[name], concurrency, args.seconds)
                    raw[name][concurrency].append(result)
                    print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency:<3} {name:38} "
                          f"{result.requests_per_s:9.1f} req/s p50 {result.p50_ms:.3f} ms", file=sys.stderr)
    finally:
        server.stop()
    return {name: {c: {"rps": statistics.median(r.requests_per_s for r in results),
                       "p50": statistics.median(r.p50_ms for r in results),
                       "p99": statistics.median(r.p99_ms for r in results),
                       "errors": sum(r.errors for r in results)}
                   for c, results in by_c.items()} for name, by_c in raw.items()}


async def _core(repo: Path, calls: int, repeats: int) -> dict[str, float]:
    """Median per-call time (us) of ModelVersion.infer, one call at a time, on the ONNX model and on the
    one- and two-step ONNX ensembles."""
    from appliance.backends import RuntimeOptions
    from appliance.engine.types import InferInput, InferRequest
    from appliance.repository.registry import ModelRegistry

    registry = ModelRegistry(repo, RuntimeOptions(), drain_timeout=5)
    await registry.load_all(["onnx", "wrap_onnx", "onnx_onnx"])
    x = np.linspace(0, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH)
    medians: dict[str, list[float]] = {"onnx": [], "wrap_onnx": [], "onnx_onnx": []}
    try:
        for _ in range(repeats):
            for name, inp in (("onnx", "x"), ("wrap_onnx", "IN"), ("onnx_onnx", "IN")):
                model = registry.get(name)
                times = []
                for _ in range(calls):
                    request = InferRequest([InferInput(inp, "FP32", x)])
                    start = time.perf_counter_ns()
                    await model.infer(request)
                    times.append((time.perf_counter_ns() - start) / 1000)
                medians[name].append(statistics.median(times))
    finally:
        await registry.close(10)
    return {name: statistics.median(values) for name, values in medians.items()}


def report(http: dict, core: dict[str, float], args: argparse.Namespace, load: tuple[list[float], list[float]]) -> str:
    lines = [f"Command: python -m bench.ensemble --seconds {args.seconds} --repeats {args.repeats} "
             f"--concurrency {','.join(map(str, args.concurrency))}", "",
             f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load[0])}; after: "
             f"{', '.join(f'{v:.2f}' for v in load[1])} on {os.cpu_count()} CPUs (the machine is shared: "
             "other work running at the same time slows every series alike, since they are interleaved).", "",
             "## Over HTTP (wrk, binary tensors, FP32 [1, 16], medians of repeats)", "",
             "| series | c | req/s | p50 ms | p99 ms | errors | p50 added vs ONNX direct |",
             "|---|---|---|---|---|---|---|"]
    for name, by_c in http.items():
        for c, m in by_c.items():
            added = (m["p50"] - http["ONNX direct"][c]["p50"]) * 1000
            lines.append(f"| {name} | {c} | {m['rps']:.1f} | {m['p50']:.3f} | {m['p99']:.3f} | {m['errors']} | "
                         f"{added:+.0f} µs |")
    lo = min(args.concurrency)
    wrap = (http["ensemble [ONNX]"][lo]["p50"] - http["ONNX direct"][lo]["p50"]) * 1000
    more = (http["ensemble [ONNX -> ONNX]"][lo]["p50"] - http["ensemble [ONNX]"][lo]["p50"]) * 1000
    python_step = (http["ensemble [Python identity -> ONNX]"][lo]["p50"] - http["ensemble [ONNX]"][lo]["p50"]) * 1000
    python_direct = (http["Python identity direct"][lo]["p50"] - http["ONNX direct"][lo]["p50"]) * 1000
    core_wrap = core["wrap_onnx"] - core["onnx"]
    core_step = (core["onnx_onnx"] - 2 * core["onnx"]) / 2
    lines += ["", "## In the core (ModelVersion.infer one call at a time, no transport; median per call)", "",
              "| model | µs per call |", "|---|---|",
              f"| ONNX direct | {core['onnx']:.1f} |", f"| ensemble [ONNX] | {core['wrap_onnx']:.1f} |",
              f"| ensemble [ONNX -> ONNX] | {core['onnx_onnx']:.1f} |", "",
              f"## What an ensemble step adds (c={lo})", "",
              "| measure | µs | target ≤ 150 µs per step |", "|---|---|---|",
              f"| core: ensemble [ONNX] − ONNX direct (the ensemble's machinery for one step) | {core_wrap:.1f} | "
              f"{'met' if core_wrap <= TARGET_US else 'MISSED'} |",
              f"| core: (ensemble [ONNX -> ONNX] − 2 × ONNX direct) / 2 (the machinery per step of a two-step "
              f"chain) | {core_step:.1f} | {'met' if core_step <= TARGET_US else 'MISSED'} |",
              f"| HTTP p50: ensemble [ONNX] − ONNX direct | {wrap:.0f} | {'met' if wrap <= TARGET_US else 'MISSED'} |",
              f"| HTTP p50: ensemble [ONNX -> ONNX] − ensemble [ONNX] (one more step, its ONNX run included) | "
              f"{more:.0f} | (includes a model run) |",
              f"| HTTP p50: ensemble [Python identity -> ONNX] − ensemble [ONNX] (a Python step) | {python_step:.0f} "
              f"| (includes the Python model's round trip) |",
              f"| HTTP p50: Python identity direct − ONNX direct (the same Python round trip, called directly) | "
              f"{python_direct:.0f} | for comparison |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16])
    parser.add_argument("--core-calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/ensemble.md"))
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo")
        core = asyncio.run(_core(repo, args.core_calls, args.repeats))
        http = measure_http(repo, Path(tmp) / "state", args)
    text = report(http, core, args, (load_before, list(os.getloadavg())))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Ensemble overhead\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
