"""Shared-memory benchmark: the CNN with its image in system shared memory, over HTTP, against the same
requests with binary tensors in the body and against onnxruntime in-process (its best batch).

    python -m bench.shared_memory [--seconds 4] [--repeats 3] [--concurrency 1,16]

Starts the daemon (127.0.0.1, ephemeral port, mDNS off), creates two POSIX shared-memory objects (the
image, and room for the logits), registers them as regions and drives the daemon with wrk on loopback,
interleaving the series each repeat; prints one table of medians with the ratios and writes it, with
JSON, to bench/results/. Every wrk connection sends the same request, so all of them read the same
input region and write the same output region (a real client would give each request in flight its
own output offset); the server's work per request is the same either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.request
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from bench.loadgen import Result, require_wrk, run_wrk
from bench.models import write_repository
from bench.process import Server, start_appliance
from bench.serving import RESULTS, _cnn_body, _delta, _histogram, _median, in_process_best

IMAGE = (1, 3, 112, 112)
LOGITS_BYTES = 10 * 4


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
    binary, binary_headers = _cnn_body()
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
        binary_body, binary_headers = _cnn_body()
        series = {
            "CNN shared memory, batching": ("cnn_batched", shm_body, shm_headers),
            "CNN shared memory, no batching": ("cnn_plain", shm_body, shm_headers),
            "CNN binary, batching": ("cnn_batched", binary_body, binary_headers),
        }
        raw: dict[str, dict[int, list[Result]]] = {name: {c: [] for c in args.concurrency} for name in series}
        histograms: dict[str, dict[int, dict[int, int]]] = {name: {} for name in series}
        in_process: dict[int, list[float]] = {}
        for model, body, headers in series.values():  # warm-up: first requests pay for lazy set-up
            run_wrk(f"{appliance.base}/v2/models/{model}/infer", body, headers, 2, 1)
        for repeat in range(args.repeats):
            # The in-process reference is measured in every repeat too, so that a box busy with other work
            # weighs on both sides alike (the daemon sits idle meanwhile).
            _, _, rates = in_process_best(repo / "cnn_plain" / "1" / "model.onnx", args.seconds / 2, 1)
            for batch, rate in rates.items():
                in_process.setdefault(batch, []).append(rate)
            print(f"  repeat {repeat + 1}/{args.repeats} in-process best {max(rates.values()):9.1f} items/s",
                  file=sys.stderr)
            for concurrency in args.concurrency:
                for name, (model, body, headers) in series.items():
                    url = f"{appliance.base}/v2/models/{model}/infer"
                    before = _histogram(appliance.base, model)
                    raw[name][concurrency].append(run_wrk(url, body, headers, concurrency, args.seconds))
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
    rates = {batch: statistics.median(samples) for batch, samples in in_process.items()}
    best_batch = max(rates, key=rates.__getitem__)
    best_rate = rates[best_batch]
    return {
        "series": {n: {c: _median(r) for c, r in by_c.items()} for n, by_c in raw.items()},
        "histograms": histograms,
        "in_process": {"best_batch": best_batch, "items_per_s": best_rate, "by_batch": rates},
        "settings": {"seconds": args.seconds, "repeats": args.repeats, "concurrency": args.concurrency},
    }


def table(data: dict) -> str:
    best = data["in_process"]["items_per_s"]
    lines = ["| series | c | req/s (items/s) | p50 ms | p99 ms | errors | ratio | batch sizes (count) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by_c in data["series"].items():
        for c, m in by_c.items():
            ratio = f"{m['rps'] / best:.2f}× in-process best"
            if name == "CNN shared memory, batching":
                ratio += f", {m['rps'] / data['series']['CNN binary, batching'][c]['rps']:.2f}× binary"
            hist = data["histograms"].get(name, {}).get(c, {})
            hist_text = " ".join(f"{k}:{v}" for k, v in hist.items()) or "-"
            lines.append(f"| {name} | {c} | {m['rps']:.1f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['errors']} | "
                         f"{ratio} | {hist_text} |")
    ip = data["in_process"]
    per_batch = ", ".join(f"b{b}: {r:.0f}" for b, r in ip["by_batch"].items())
    lines.append(f"| onnxruntime in-process CNN, best batch {ip['best_batch']} | - | {best:.1f} | - | - | - | "
                 f"physical limit ({per_batch}) | - |")
    return "\n".join(lines)


def targets(data: dict) -> list[str]:
    hi = max(data["settings"]["concurrency"])
    series = data["series"]
    ratio = max(series["CNN shared memory, batching"][hi]["rps"],
                series["CNN shared memory, no batching"][hi]["rps"]) / data["in_process"]["items_per_s"]
    ok = ratio >= 0.9
    errors = sum(m["errors"] for by_c in series.values() for m in by_c.values())
    return [f"- {'met' if ok else 'MISSED'}: CNN over shared memory c={hi} >= 0.9x in-process best ({ratio:.2f})",
            f"- {'met' if errors == 0 else 'MISSED'}: no errors ({errors})"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each wrk run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(args, Path(tmp))
    text = table(data) + "\n\nTargets:\n" + "\n".join(targets(data))
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
