"""Memory-aware serving (docs/memory.md): what a first request costs when its model loads on demand, per
backend, and what a 20-model repository holds with and without a model memory budget.

    python -m bench.memory [--repeats 5] [--models 20] [--model-mib 40] [--budget-mib 200]

1. First-request latency: the daemon (explicit mode, --load-on-demand, selection off) over the benchmark
   repository, with the small CNN also as an OpenVINO IR and as TorchScript where those runtimes are
   installed; for each model, its first load over the load API is timed (for OpenVINO and PyTorch it
   pays the runtime's import in the daemon), then --repeats times: unload it, then time one request (the
   load on demand and the inference) and a second one (warm). Medians.
2. RSS: --models Python models that each hold --model-mib MiB, every one requested once in turn; the
   process tree's RSS (daemon and model processes) sampled every 20 ms, its peak over the idle daemon
   reported, once with every model loaded at start (no budget) and once with --load-on-demand and
   --model-memory-budget-mib.

Results go to bench/results/memory.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from appliance.repository.memory import process_rss
from bench.models import write_repository
from bench.process import Server, start_appliance

RESULTS = Path(__file__).parent / "results"
MIB = 1024 * 1024

HOLDER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ballast = np.ones({size} // 8)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''
HOLDER_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def _call(server: Server, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.base + path, data=data, method="GET" if data is None else "POST")
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read() or b"{}")


def _body(metadata: dict) -> dict:
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [1 if d == -1 else d for d in tensor["shape"]]
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": tensor["name"], "datatype": tensor["datatype"], "shape": shape,
                       "data": [0.0] * count})
    return {"inputs": inputs}


_TORCHSCRIPT_CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 112, 112 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


def write_runtime_models(repo: Path) -> list[str]:
    """bench.models' small CNN as an OpenVINO IR (cnn_openvino, converted from its ONNX) and as TorchScript
    (cnn_torchscript, the same layers traced in PyTorch), each where its runtime is installed; their names."""
    written = []
    try:
        import openvino as ov
    except ImportError:
        ov = None
    if ov is not None:
        onnx_path = repo / "cnn_plain" / "1" / "model.onnx"
        (repo / "cnn_openvino" / "1").mkdir(parents=True, exist_ok=True)
        ov.save_model(ov.convert_model(str(onnx_path)), str(repo / "cnn_openvino" / "1" / "model.xml"),
                      compress_to_fp16=False)
        (repo / "cnn_openvino" / "config.pbtxt").write_text('backend: "openvino"\nmax_batch_size: 16\n')
        written.append("cnn_openvino")
    try:
        import torch
    except ImportError:
        return written
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for cin, cout, stride in [(3, 32, 2), (32, 64, 1), (64, 64, 2), (64, 128, 2)]:  # as cnn_model's
        layers += [torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(128, 10)).eval()
    (repo / "cnn_torchscript" / "1").mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(net, torch.zeros(1, 3, 112, 112)).save(str(repo / "cnn_torchscript" / "1" / "model.pt"))
    (repo / "cnn_torchscript" / "config.pbtxt").write_text(_TORCHSCRIPT_CONFIG)
    written.append("cnn_torchscript")
    return written


def first_requests(workdir: Path, repeats: int) -> dict[str, dict[str, float]]:
    repo = write_repository(workdir / "repo")
    others = write_runtime_models(repo)
    server = start_appliance(repo, workdir / "state-latency", "--no-selection", "--no-metrics",
                             "--model-control-mode", "explicit", "--load-on-demand")
    figures: dict[str, dict[str, float]] = {}
    try:
        for model in ("tiny", "cnn_plain", "identity_onnx", "identity_python", *others):
            started = time.perf_counter()
            _call(server, f"/v2/repository/models/{model}/load", {})
            first_load = time.perf_counter() - started
            metadata = _call(server, f"/v2/models/{model}")
            body = _body(metadata)
            cold, warm = [], []
            for _ in range(repeats):
                _call(server, f"/v2/repository/models/{model}/unload", {})
                started = time.perf_counter()
                _call(server, f"/v2/models/{model}/infer", body)
                cold.append(time.perf_counter() - started)
                started = time.perf_counter()
                _call(server, f"/v2/models/{model}/infer", body)
                warm.append(time.perf_counter() - started)
            figures[f"{model} ({metadata['platform']})"] = {"load_ms": first_load * 1000,
                                                            "first_ms": statistics.median(cold) * 1000,
                                                            "warm_ms": statistics.median(warm) * 1000}
    finally:
        server.stop()
    return figures


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it, summed as the daemon sums a model's processes."""
    return process_rss([pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))])


def _sample(pid: int, peak: list[int], stop: threading.Event) -> None:
    """Keep the largest tree RSS of ``pid`` in ``peak[0]`` until ``stop``."""
    while not stop.is_set():
        peak[0] = max(peak[0], _tree_rss(pid))
        stop.wait(0.02)


def repository_rss(workdir: Path, models: int, model_mib: int, budget_mib: int) -> dict[str, float]:
    repo = workdir / "many"
    for index in range(models):
        directory = repo / f"m{index:02d}" / "1"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model.py").write_text(HOLDER.format(size=model_mib * MIB))
        (repo / f"m{index:02d}" / "config.pbtxt").write_text(HOLDER_CONFIG)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": [0.0] * 16}]}
    figures: dict[str, float] = {}
    for label, args in (("all loaded, no budget", ()),
                        (f"load on demand, budget {budget_mib} MiB",
                         ("--load-on-demand", "--model-memory-budget-mib", str(budget_mib)))):
        state = workdir / f"state-{len(figures)}"
        server = start_appliance(repo, state, "--no-selection", "--no-metrics", "--no-grpc", *args)
        try:
            idle = _tree_rss(server.process.pid) if args else None
            peak, stop = [0], threading.Event()
            sampler = threading.Thread(target=_sample, args=(server.process.pid, peak, stop))
            sampler.start()
            started = time.perf_counter()
            for index in range(models):
                _call(server, f"/v2/models/m{index:02d}/infer", body)
            elapsed = time.perf_counter() - started
            stop.set()
            sampler.join()
            figures[f"{label}: peak tree RSS (MiB)"] = peak[0] / MIB
            if idle is not None:
                figures[f"{label}: idle daemon (MiB)"] = idle / MIB
            figures[f"{label}: {models} requests, one per model (s)"] = elapsed
        finally:
            server.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--model-mib", type=int, default=40)
    parser.add_argument("--budget-mib", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        latency = first_requests(Path(scratch), args.repeats)
        rss = repository_rss(Path(scratch), args.models, args.model_mib, args.budget_mib)
    lines = ["# Memory-aware serving (bench/memory.py)", "",
             f"`python -m bench.memory --repeats {args.repeats} --models {args.models} --model-mib {args.model_mib} "
             f"--budget-mib {args.budget_mib}`, CPU only, {psutil.cpu_count()} CPUs.", "",
             "## First request with load on demand (median)", "",
             "Models in this order; its first load is the load API's, before any request (the first OpenVINO "
             "or PyTorch model pays its runtime's import in the daemon there).", "",
             "| model (platform) | its first load, ms | first request, ms | warm request, ms |", "|---|---|---|---|"]
    lines += [f"| {model} | {f['load_ms']:.0f} | {f['first_ms']:.0f} | {f['warm_ms']:.1f} |"
              for model, f in latency.items()]
    lines += ["", f"## {args.models} Python models of {args.model_mib} MiB each", "", "| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in rss.items()]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "memory.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
