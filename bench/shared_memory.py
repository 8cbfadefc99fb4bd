"""Shared-memory benchmark: the CNN with its image in system shared memory, over HTTP, against the same
requests with binary tensors in the body and against onnxruntime in-process (its best batch).

    python -m bench.shared_memory [--seconds 4] [--repeats 3] [--concurrency 1,16]

Starts the daemon (127.0.0.1, ephemeral port, mDNS off), creates two POSIX shared-memory objects (the
image, and room for the logits), registers them as regions and drives the daemon with wrk on loopback,
interleaving the series each repeat; prints one table of medians with the ratios and writes it, with
JSON, to bench/results/. Beside throughput it gives the daemon's CPU time per request (all its threads)
and onnxruntime's CPU time per item in-process: on a box busy with other work, throughput swings with
the load, CPU time much less. Every wrk connection sends the same request, so all of them read the
same input region and write the same output region (a real client would give each request in flight
its own output offset); the server's work per request is the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from bench.loadgen import Result, add_wrk_arguments, require_wrk, run_wrk
from bench.models import write_repository
from bench.process import Server, start_appliance
from bench.serving import _CNN, BATCHES, RESULTS, _binary_body, _delta, _histogram, _median

IMAGE = (1, 3, 112, 112)
LOGITS_BYTES = 10 * 4


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _in_process(model: Path, seconds: float) -> dict[int, tuple[float, float]]:
    """onnxruntime in this process: per batch size, (items/s, CPU ms per item)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rates = {}
    for batch in BATCHES:
        x = np.random.default_rng(2).random((batch, *IMAGE[1:])).astype(np.float32)
        session.run(None, {"image": x})
        count, start, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            session.run(None, {"image": x})
            count += batch
        rates[batch] = (count / (time.perf_counter() - start), (time.process_time() - cpu) * 1000 / count)
    return rates


def _post(server: Server, path: str, document: dict) -> None:
    request = urllib.request.Request(f"{server.base}{path}", data=json.dumps(document).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def _shm_body(image_region: str, output_region: str) -> tuple[bytes, dict[str, str]]:
    image_bytes = int(np.prod(IMAGE)) * 4
    body = json.dumps({
        "inputs": [{"name": "image", "shape": list(IMAGE), "datatype": "FP32",
                    "parameters": {"shared_memory_region": image_region, "shared_memory_byte_size": image_bytes}}],
        "outputs": [{"name": "logits", "parameters": {"shared_memory_region": output_region,
                                                      "shared_memory_byte_size": LOGITS_BYTES}}],
    }).encode()
    return body, {"Content-Type": "application/json"}


def _regions(server: Server) -> list[shared_memory.SharedMemory]:
    """The image and the logits' room as clients make them, registered as 'image' and 'logits'."""
    image = np.random.default_rng(1).random(IMAGE).astype(np.float32)
    made = []
    for name, size in (("image", image.nbytes), ("logits", LOGITS_BYTES)):
        key = f"/bench-{name}-{uuid.uuid4().hex[:8]}"
        made.append(shared_memory.SharedMemory(key, create=True, size=size))
        _post(server, f"/v2/systemsharedmemory/region/{name}/register", {"key": key, "offset": 0, "byte_size": size})
    np.ndarray(IMAGE, np.float32, buffer=made[0].buf)[:] = image
    return made


def _check_logits(server: Server, body: bytes, headers: dict[str, str], logits: shared_memory.SharedMemory) -> None:
    """One request through shared memory gives the logits the binary request gives in its body."""
    request = urllib.request.Request(f"{server.base}/v2/models/cnn_plain/infer", data=body, headers=headers)
    urllib.request.urlopen(request, timeout=10).read()
    got = np.ndarray((1, 10), np.float32, buffer=logits.buf).copy()
    binary, binary_headers = _binary_body(_CNN)
    request = urllib.request.Request(f"{server.base}/v2/models/cnn_plain/infer", data=binary, headers=binary_headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        header_length = int(response.headers["Inference-Header-Content-Length"])
    np.testing.assert_allclose(got, np.frombuffer(raw[header_length:], np.float32).reshape(1, 10), rtol=1e-5)


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    repo = write_repository(workdir / "repo")
    appliance = start_appliance(repo, workdir / "state")
    regions: list[shared_memory.SharedMemory] = []
    try:
        regions = _regions(appliance)
        shm_body, shm_headers = _shm_body("image", "logits")
        _check_logits(appliance, shm_body, shm_headers, regions[1])
        binary_body, binary_headers = _binary_body(_CNN)
        series = {
            "CNN shared memory, batching": ("cnn_batched", shm_body, shm_headers),
            "CNN shared memory, no batching": ("cnn_plain", shm_body, shm_headers),
            "CNN binary, batching": ("cnn_batched", binary_body, binary_headers),
        }
        raw: dict[str, dict[int, list[Result]]] = {name: {c: [] for c in args.concurrency} for name in series}
        cpu: dict[str, dict[int, list[float]]] = {name: {c: [] for c in args.concurrency} for name in series}
        histograms: dict[str, dict[int, dict[int, int]]] = {name: {} for name in series}
        in_process: dict[int, list[tuple[float, float]]] = {}
        for model, body, headers in series.values():  # warm-up: first requests pay for lazy set-up
            run_wrk(f"{appliance.base}/v2/models/{model}/infer", body, headers, 2, 1)
        for repeat in range(args.repeats):
            # The in-process reference is measured in every repeat too, so that a box busy with other work
            # weighs on both sides alike (the daemon sits idle meanwhile).
            rates = _in_process(repo / "cnn_plain" / "1" / "model.onnx", args.seconds / 2)
            for batch, rate in rates.items():
                in_process.setdefault(batch, []).append(rate)
            print(f"  repeat {repeat + 1}/{args.repeats} in-process best {max(r for r, _ in rates.values()):9.1f} "
                  "items/s", file=sys.stderr)
            for concurrency in args.concurrency:
                for name, (model, body, headers) in series.items():
                    url = f"{appliance.base}/v2/models/{model}/infer"
                    before, cpu_before = _histogram(appliance.base, model), _cpu_seconds(appliance.process.pid)
                    result = run_wrk(url, body, headers, concurrency, args.seconds)
                    requests = result.requests_per_s * max(1, round(args.seconds))
                    cpu[name][concurrency].append(
                        (_cpu_seconds(appliance.process.pid) - cpu_before) * 1000 / max(requests, 1))
                    raw[name][concurrency].append(result)
                    if repeat == args.repeats - 1:
                        histograms[name][concurrency] = _delta(_histogram(appliance.base, model), before)
                    print(f"  repeat {repeat + 1}/{args.repeats} c={concurrency:<3} {name:32} "
                          f"{raw[name][concurrency][-1].requests_per_s:9.1f} req/s", file=sys.stderr)
        _post(appliance, "/v2/systemsharedmemory/unregister", {})
    finally:
        appliance.stop()
        for region in regions:
            region.close()
            region.unlink()
    rates = {batch: statistics.median(r for r, _ in samples) for batch, samples in in_process.items()}
    cpu_per_item = {batch: statistics.median(c for _, c in samples) for batch, samples in in_process.items()}
    best_batch = max(rates, key=rates.__getitem__)
    series = {n: {c: _median(r) for c, r in by_c.items()} for n, by_c in raw.items()}
    for name, by_c in cpu.items():
        for c, samples in by_c.items():
            series[name][c]["cpu_ms"] = statistics.median(samples)
    return {
        "series": series,
        "histograms": histograms,
        "in_process": {"best_batch": best_batch, "items_per_s": rates[best_batch], "by_batch": rates,
                       "cpu_ms_per_item": cpu_per_item},
        "settings": {"seconds": args.seconds, "repeats": args.repeats, "concurrency": args.concurrency},
    }


def table(data: dict) -> str:
    best = data["in_process"]["items_per_s"]
    best_cpu = data["in_process"]["cpu_ms_per_item"][data["in_process"]["best_batch"]]
    lines = ["| series | c | req/s (items/s) | p50 ms | p99 ms | errors | daemon CPU ms/request | ratio | "
             "batch sizes (count) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, by_c in data["series"].items():
        for c, m in by_c.items():
            ratio = f"{m['rps'] / best:.2f}× in-process best"
            if name == "CNN shared memory, batching":
                ratio += f", {m['rps'] / data['series']['CNN binary, batching'][c]['rps']:.2f}× binary"
            hist = data["histograms"].get(name, {}).get(c, {})
            hist_text = " ".join(f"{k}:{v}" for k, v in hist.items()) or "-"
            lines.append(f"| {name} | {c} | {m['rps']:.1f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['errors']} | "
                         f"{m['cpu_ms']:.2f} | {ratio} | {hist_text} |")
    ip = data["in_process"]
    per_batch = ", ".join(f"b{b}: {r:.0f} ({ip['cpu_ms_per_item'][b]:.2f} ms CPU)" for b, r in ip["by_batch"].items())
    lines.append(f"| onnxruntime in-process CNN, best batch {ip['best_batch']} | - | {best:.1f} | - | - | - | "
                 f"{best_cpu:.2f} per item | physical limit ({per_batch}) | - |")
    return "\n".join(lines)


def targets(data: dict) -> list[str]:
    hi = max(data["settings"]["concurrency"])
    series = data["series"]
    ip = data["in_process"]
    name = max(("CNN shared memory, batching", "CNN shared memory, no batching"), key=lambda n: series[n][hi]["rps"])
    ratio = series[name][hi]["rps"] / ip["items_per_s"]
    efficiency = ip["cpu_ms_per_item"][ip["best_batch"]] / series[name][hi]["cpu_ms"]
    errors = sum(m["errors"] for by_c in series.values() for m in by_c.values())
    return [f"- {'met' if ratio >= 0.9 else 'MISSED'}: CNN over shared memory c={hi} >= 0.9x in-process best "
            f"({ratio:.2f}, {name}; CPU per item: the daemon's is {1 / efficiency:.2f}x in-process's)",
            f"- {'met' if errors == 0 else 'MISSED'}: no errors ({errors})"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wrk_arguments(parser)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(args, Path(tmp))
    load = (f"Load average (1 min) on this {os.cpu_count()}-CPU box: {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after.")
    text = table(data) + "\n\nTargets:\n" + "\n".join(targets(data)) + "\n\n" + load
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared_memory.md").write_text(
        f"Command: python -m bench.shared_memory --seconds {args.seconds:g} --repeats {args.repeats} "
        f"--concurrency {','.join(map(str, args.concurrency))}\n\n{text}\n"
    )
    (args.out / "shared_memory.json").write_text(json.dumps(data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
