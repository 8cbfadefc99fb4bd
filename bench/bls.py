"""BLS benchmark: a Python model calling an ONNX identity with ``InferenceRequest.exec()``, against the
ONNX identity called directly and against a Python identity that calls nothing.

    python -m bench.bls [--seconds 4] [--repeats 3] [--concurrency 1,16]

Starts the daemon (127.0.0.1, ephemeral port, mDNS off, selection off) on a generated repository and
drives it with wrk over HTTP (JSON bodies, one FP32 [1, 16] tensor), interleaving the three series each
repeat; prints one table of medians and writes it, with JSON, to bench/results/bls.md and bls.json.

What a BLS call costs is the Python model that calls minus the Python model that does not (both pay
the hop into a model process; only the first pays the call back into the daemon's scheduler and the
ONNX run). The target (issue 15) is at most 300 us per BLS call at c=1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from bench.loadgen import Result, require_wrk, run_wrk
from bench.process import start_appliance
from bench.serving import RESULTS

TARGET_US = 300.0
WIDTH = 16

_IDENTITY_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 16
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

_PYTHON_CONFIG = f"""
backend: "python"
max_batch_size: 16
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""

_BLS = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            start = time.perf_counter_ns()
            response = call.exec()
            took = time.perf_counter_ns() - start
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse(response.output_tensors(), parameters={"exec_ns": took}))
        return responses
"""

_PY_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                             .as_numpy())]) for r in requests]
"""

SERIES = {"onnx_direct": "identity", "python_identity": "py_identity", "bls": "bls"}


def write_repository(root: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])], "identity",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", WIDTH])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "identity" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "identity" / "1" / "model.onnx"))
    (root / "identity" / "config.pbtxt").write_text(_IDENTITY_CONFIG)
    for name, source in (("bls", _BLS), ("py_identity", _PY_IDENTITY)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (root / name / "config.pbtxt").write_text(_PYTHON_CONFIG)
    return root


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "shape": [1, WIDTH], "datatype": "FP32",
                                   "data": [float(i) for i in range(WIDTH)]}]}).encode()


def _median(results: list[Result]) -> dict[str, float]:
    return {
        "rps": statistics.median(r.requests_per_s for r in results),
        "p50_us": statistics.median(r.p50_ms for r in results) * 1000,
        "p99_us": statistics.median(r.p99_ms for r in results) * 1000,
        "errors": sum(r.errors for r in results),
    }


def _exec_cost(base: str, count: int) -> dict[str, float]:
    """exec() timed inside the calling model (its response parameter ``exec_ns``), one request at a time."""
    import numpy as np
    import tritonclient.http as httpclient

    samples = []
    with httpclient.InferenceServerClient(base.removeprefix("http://")) as client:
        tensor = httpclient.InferInput("IN", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH))
        for _ in range(count):
            samples.append(client.infer("bls", [tensor]).get_response()["parameters"]["exec_ns"] / 1000)
    samples.sort()
    return {"p50_us": statistics.median(samples), "p90_us": samples[int(len(samples) * 0.9)]}


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    require_wrk()
    repo = write_repository(workdir / "repo")
    server = start_appliance(repo, workdir / "state")  # as deployed: selection decides where the identity runs
    body, headers = _body(), {"Content-Type": "application/json"}
    runs: dict[int, dict[str, list[Result]]] = {c: {s: [] for s in SERIES} for c in args.concurrency}
    exec_costs = []
    try:
        for model in SERIES.values():  # warm every path (model processes, arenas, sessions)
            run_wrk(f"{server.base}/v2/models/{model}/infer", body, headers, 1, 1)
        for _ in range(args.repeats):
            exec_costs.append(_exec_cost(server.base, 300))
            for concurrency in args.concurrency:
                for series, model in SERIES.items():
                    url = f"{server.base}/v2/models/{model}/infer"
                    runs[concurrency][series].append(run_wrk(url, body, headers, concurrency, args.seconds))
    finally:
        server.stop()
    results: dict = {str(c): {s: _median(r) for s, r in by_series.items()} for c, by_series in runs.items()}
    results["exec_in_model"] = {key: statistics.median(c[key] for c in exec_costs) for key in ("p50_us", "p90_us")}
    return results


def table(results: dict) -> str:
    lines = [
        "| c | ONNX direct p50 | Python identity p50 | BLS p50 | BLS call (BLS − Python identity) | "
        "BLS − ONNX direct | BLS req/s | ONNX req/s | target ≤ 300 µs per BLS call at c=1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency, series in results.items():
        if concurrency == "exec_in_model":
            continue
        onnx_p50 = series["onnx_direct"]["p50_us"]
        py_p50 = series["python_identity"]["p50_us"]
        bls_p50 = series["bls"]["p50_us"]
        call = bls_p50 - py_p50
        verdict = ("met" if call <= TARGET_US else "missed") if concurrency == "1" else "—"
        lines.append(
            f"| {concurrency} | {onnx_p50:.0f} µs | {py_p50:.0f} µs | {bls_p50:.0f} µs | {call:.0f} µs | "
            f"{bls_p50 - onnx_p50:.0f} µs | {series['bls']['rps']:.0f} | {series['onnx_direct']['rps']:.0f} | "
            f"{verdict} |"
        )
    inside = results["exec_in_model"]
    verdict = "met" if inside["p50_us"] <= TARGET_US else "missed"
    lines += ["", "| exec() timed inside the calling model, c=1 | p50 | p90 | target ≤ 300 µs |", "|---|---|---|---|",
              f"| one BLS call (FP32 [1, {WIDTH}] to the ONNX identity) | {inside['p50_us']:.0f} µs | "
              f"{inside['p90_us']:.0f} µs | {verdict} |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each wrk run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-bls-") as tmp:
        results = measure(args, Path(tmp))
    text = table(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.bls " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / "bls.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "bls.md").write_text(
        "# BLS round trip\n\n"
        f"`{command.strip()}`: HTTP JSON requests (FP32 [1, {WIDTH}]) from wrk on loopback, medians of "
        f"{args.repeats} interleaved runs of {args.seconds:g} s. The BLS model calls the ONNX identity with "
        "`InferenceRequest.exec()` once per request; the Python identity returns its input and calls nothing, so "
        "BLS − Python identity is what the call itself costs (into the daemon, through the identity's "
        "scheduler and onnxruntime, and back through shared memory). The second table times `exec()` inside the "
        "model (300 sequential requests per repeat), without the HTTP hop. Load average of the box during the run: "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.\n\n"
        f"{text}\n"
    )


if __name__ == "__main__":
    main()
