"""Streaming benchmark: a decoupled Python model's responses over gRPC ModelStreamInfer and over HTTP
generate_stream, and the memory a slow client costs.

    python -m bench.streaming [--responses 20000] [--repeats 3]

Starts the daemon (127.0.0.1, ephemeral ports, mDNS off) with one decoupled Python model, ``burst``,
that sends COUNT responses of SIZE INT32 elements from execute, then the final flag. Series:

- responses/s of one request of ``--responses`` small responses, over gRPC (tritonclient's stream) and
  over generate_stream (server-sent events read with http.client);
- the round trip of a one-response request on an open gRPC stream, sequentially (p50, p99);
- backpressure: one request of 256 responses of 1 MiB read by a client that takes 20 ms per response:
  the daemon's and the model process's peak private memory (RssAnon) above their idle level (without a
  bound the daemon would hold every response the client has not read), and the shared memory
  (RssShmem: the Python backend's arenas, which carry the responses between the processes) the daemon
  maps after the run.

Prints one table of medians and writes it, with JSON, to bench/results/streaming.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.process import start_appliance

RESULTS = Path(__file__).parent / "results"

BURST = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            for index in range(count):
                out = np.full(size, index, np.int32)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

BURST_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''


def _repository(root: Path) -> Path:
    (root / "burst" / "1").mkdir(parents=True)
    (root / "burst" / "1" / "model.py").write_text(BURST)
    (root / "burst" / "config.pbtxt").write_text(BURST_CONFIG)
    return root


def _grpc_inputs(count: int, size: int):
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in (("COUNT", count), ("SIZE", size)):
        tensor = grpcclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(tensor)
    return inputs


def grpc_rate(grpc_port: int, count: int) -> float:
    """Responses per second of one request of ``count`` responses over a gRPC stream."""
    import tritonclient.grpc as grpcclient

    done = threading.Event()
    received = [0]

    def callback(result, error):
        if error is not None:
            raise SystemExit(f"stream error: {error}")
        received[0] += 1
        if received[0] == count:
            done.set()

    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        client.start_stream(callback=callback)
        start = time.perf_counter()
        client.async_stream_infer("burst", _grpc_inputs(count, 1))
        if not done.wait(300):
            raise SystemExit(f"only {received[0]} of {count} responses arrived")
        elapsed = time.perf_counter() - start
        client.stop_stream()
    return count / elapsed


def grpc_round_trips(grpc_port: int, requests: int) -> list[float]:
    """Milliseconds from sending a one-response request on an open stream to its response."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    times = []
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error))
        inputs = _grpc_inputs(1, 1)
        for _ in range(requests):
            start = time.perf_counter()
            client.async_stream_infer("burst", inputs)
            if answers.get(timeout=60) is not None:
                raise SystemExit("stream error")
            times.append((time.perf_counter() - start) * 1000)
        client.stop_stream()
    return times


def _sse(port: int, count: int, size: int, pause: float = 0.0) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"COUNT": count, "SIZE": size})
    connection.request("POST", "/v2/models/burst/generate_stream", body=body)
    response = connection.getresponse()
    events = 0
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events += 1
            if b'"error"' in line[:20]:
                raise SystemExit(f"error event: {line[:200]!r}")
            if pause:
                time.sleep(pause)
    connection.close()
    return events


def sse_rate(port: int, count: int) -> float:
    start = time.perf_counter()
    events = _sse(port, count, 1)
    elapsed = time.perf_counter() - start
    if events != count:
        raise SystemExit(f"{events} of {count} events")
    return count / elapsed


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _status_mib(pid: int, field: str) -> float:
    """One memory field of /proc/<pid>/status (RssAnon: private memory; RssShmem: shared memory mapped)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def slow_client_memory(port: int, pid: int) -> tuple[float, float, float, float]:
    """For 256 x 1 MiB read at 20 ms per response: (daemon's peak private memory above idle, the model
    process's, the shared memory the daemon maps at the end above idle (the Python backend's arenas),
    seconds)."""
    children = _children(pid)
    idle = _status_mib(pid, "RssAnon"), sum(_status_mib(c, "RssAnon") for c in children)
    shared = _status_mib(pid, "RssShmem")
    peaks = list(idle)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peaks[0] = max(peaks[0], _status_mib(pid, "RssAnon"))
            peaks[1] = max(peaks[1], sum(_status_mib(c, "RssAnon") for c in children))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.perf_counter()
    try:
        events = _sse(port, 256, 1 << 18, pause=0.02)
    finally:
        stop.set()
        watcher.join()
    seconds = time.perf_counter() - start
    if events != 256:
        raise SystemExit(f"{events} of 256 events")
    return peaks[0] - idle[0], peaks[1] - idle[1], _status_mib(pid, "RssShmem") - shared, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        repo = _repository(Path(tmp) / "repo")
        server = start_appliance(repo, Path(tmp) / "state", "--no-selection", "--no-metrics")
        try:
            assert server.grpc_port is not None
            grpc_round_trips(server.grpc_port, 50)  # warm up
            rows: dict[str, list[float]] = {"grpc": [], "sse": [], "p50": [], "p99": [], "daemon": [], "model": [],
                                            "arena": [], "slow_s": []}
            for _ in range(args.repeats):
                rows["grpc"].append(grpc_rate(server.grpc_port, args.responses))
                rows["sse"].append(sse_rate(server.port, args.responses))
                trips = sorted(grpc_round_trips(server.grpc_port, 500))
                rows["p50"].append(trips[len(trips) // 2])
                rows["p99"].append(trips[int(len(trips) * 0.99)])
                daemon, model, arena, seconds = slow_client_memory(server.port, server.process.pid)
                rows["daemon"].append(daemon)
                rows["model"].append(model)
                rows["arena"].append(arena)
                rows["slow_s"].append(seconds)
        finally:
            server.stop()
    median = {key: statistics.median(values) for key, values in rows.items()}
    table = "\n".join([
        f"| series | median of {args.repeats} |",
        "|---|---|",
        f"| gRPC stream, one request of {args.responses} responses | {median['grpc']:,.0f} responses/s |",
        f"| generate_stream (SSE), one request of {args.responses} responses | {median['sse']:,.0f} events/s |",
        f"| gRPC stream, one-response request round trip, sequential | p50 {median['p50']:.2f} ms, "
        f"p99 {median['p99']:.2f} ms |",
        f"| slow SSE client (256 x 1 MiB, 20 ms per response, {median['slow_s']:.1f} s): peak private memory "
        f"above idle | daemon +{median['daemon']:.0f} MiB, model process +{median['model']:.0f} MiB (256 MiB sent) |",
        f"| the same: shared memory (Python backend arenas) the daemon maps after it, above before | "
        f"+{median['arena']:.0f} MiB |",
    ])
    print(table)
    RESULTS.mkdir(exist_ok=True)
    command = f"python -m bench.streaming --responses {args.responses} --repeats {args.repeats}"
    (RESULTS / "streaming.md").write_text(
        f"# Streaming (decoupled models)\n\n`{command}`\n\n{table}\n\n```json\n{json.dumps(rows, indent=1)}\n```\n")


if __name__ == "__main__":
    main()
