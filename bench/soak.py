"""Soak: one daemon under a steady mix of every kind of traffic for an hour, watched for growth and 5xx.

    python -m bench.soak [--minutes 60] [--warmup-minutes 10] [--rate 1.0] [--sample-every 60]

Not run in CI. Starts the daemon on 127.0.0.1 (ephemeral ports, mDNS and selection off, explicit model
control) over a repository of its own, and keeps, at a steady rate (``--rate`` scales every one; at 1.0
about 17 requests a second in all, so that a shared box is not starved):

- HTTP inference, JSON (3/s) and binary (2/s), and gRPC inference (3/s) on ``tiny`` (dynamic batching);
- a Python-backend model (2/s, HTTP): its requests cross the process boundary through /dev/shm arenas;
- streams: one gRPC ModelStreamInfer stream (1 request/s of 4 responses, the stream reopened every
  minute) and HTTP generate_stream (one every 2 s) on a decoupled Python model;
- sequences: one 8-frame sequence every 4 s on a sequence-batched model with implicit state,
  alternately over HTTP and gRPC;
- shared memory: every 2 s a client makes two system regions, registers them (alternately over HTTP
  and gRPC), runs one request through them, unregisters and unlinks them;
- metadata, statistics, the repository index, health and /metrics (1/s);
- reloads: ``tiny`` reloaded under traffic every 30 s, a spare model unloaded and loaded every 2
  minutes, and a model pushed with file overrides (Triton's load API) every 5 minutes.

Each minute it samples the daemon's resident memory, its model processes' (the Python backend's
children), open file descriptors, threads, the bytes its process tree holds in /dev/shm (the arenas,
named ``appliance-<pid>-``, plus this client's regions), the SQLite history (metrics.db with its WAL)
and the pushed models on disk. After ``--warmup-minutes`` each series' least-squares slope is reported
per hour; the target is no growth beyond noise: the slope over the measured span must stay within
three standard deviations of the residuals around the line, or a floor per series (the sampling
granularity: a few MiB of RSS, a couple of descriptors or threads). Every 5xx (and gRPC INTERNAL,
UNKNOWN, UNAVAILABLE or DATA_LOSS) is listed; the target is none. Other failures (4xx, wrong answers,
dropped connections) are listed too and must also be none.

The history keeps raw rows 3 minutes and minute rows 7 (environment of the daemon), so it reaches its
steady state within the warm-up; with the defaults it grows, by design, towards 24 hours of rows.

Writes bench/results/soak.md and soak.json (samples, written as they are taken: a run cut short
keeps them); prints met/MISSED per target.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import http.client
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import psutil
from tritonclient.utils import InferenceServerException

from appliance.examples.sequence import FRAME, vad_config, vad_state_model, write_sequence_model
from bench.models import write_repository
from bench.process import Server, start_appliance
from bench.streaming import BURST, BURST_CONFIG

RESULTS = Path(__file__).parent / "results"
SERVER_GRPC_CODES = ("StatusCode.INTERNAL", "StatusCode.UNKNOWN", "StatusCode.UNAVAILABLE", "StatusCode.DATA_LOSS")
SEQUENCE_STEPS = 8
STREAM_RESPONSES = 4
REGION_PREFIX = f"soak-{os.getpid()}-"
# Growth below these is within what one sample can move by itself, whatever the residuals say.
FLOORS = {"rss_mib": 8.0, "children_rss_mib": 8.0, "fds": 4.0, "threads": 2.0, "dev_shm_mib": 1.0,
          "sqlite_mib": 1.0, "pushed_mib": 0.5}
UNITS = {"rss_mib": "MiB", "children_rss_mib": "MiB", "fds": "", "threads": "", "dev_shm_mib": "MiB",
         "sqlite_mib": "MiB", "pushed_mib": "MiB"}
HISTORY_ENV = {"APPLIANCE_HISTORY_RAW_HOURS": "0.05", "APPLIANCE_HISTORY_MINUTE_DAYS": "0.005"}


# -- the repository ----------------------------------------------------------------------------------
MODELS = ("tiny", "identity_onnx", "identity_python", "spare", "burst", "vad")
"""The models the daemon loads (the benchmark repository's CNNs are left unloaded)."""


def write_soak_repository(root: Path) -> Path:
    write_repository(root)  # tiny, identity_onnx, identity_python (and CNNs, not loaded here)
    shutil.copytree(root / "identity_onnx", root / "spare")
    (root / "burst" / "1").mkdir(parents=True)
    (root / "burst" / "1" / "model.py").write_text(BURST)
    (root / "burst" / "config.pbtxt").write_text(BURST_CONFIG)
    write_sequence_model(root, "vad", vad_state_model(), vad_config(idle_us=30_000_000))
    return root


# -- what went wrong ---------------------------------------------------------------------------------
class Failure(Exception):
    def __init__(self, message: str, server: bool = False) -> None:
        super().__init__(message)
        self.server = server
        """A 5xx (or a gRPC code that means the server failed)."""


@dataclasses.dataclass
class Tally:
    started: float
    ok: Counter = dataclasses.field(default_factory=Counter)
    failed: Counter = dataclasses.field(default_factory=Counter)
    server_errors: list[dict] = dataclasses.field(default_factory=list)
    other_errors: list[dict] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def record(self, kind: str, error: BaseException | None) -> None:
        with self.lock:
            if error is None:
                self.ok[kind] += 1
                return
            self.failed[kind] += 1
            entry = {"t": round(time.monotonic() - self.started, 1), "kind": kind,
                     "error": f"{type(error).__name__}: {error}"[:300]}
            target = self.server_errors if isinstance(error, Failure) and error.server else self.other_errors
            if len(target) < 200:
                target.append(entry)


def _check_http(status: int, body: bytes, what: str) -> None:
    if status >= 500:
        raise Failure(f"{what}: HTTP {status}: {body[:200]!r}", server=True)
    if status >= 400:
        raise Failure(f"{what}: HTTP {status}: {body[:200]!r}")


def _grpc_failure(exc: Exception, what: str) -> Failure:
    status = exc.status() if isinstance(exc, InferenceServerException) else None
    return Failure(f"{what}: gRPC {status}: {exc}", server=str(status) in SERVER_GRPC_CODES)


class Http:
    """One keep-alive connection per thread, made again after any transport error, and after
    ``IDLE_REOPEN`` seconds unused (the daemon closes connections idle for header_timeout, 60 s: a
    request written on such a connection would fail on the client's side, not the server's)."""

    IDLE_REOPEN = 30.0

    def __init__(self, port: int) -> None:
        self._port = port
        self._connection: http.client.HTTPConnection | None = None
        self._used = 0.0

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        if self._connection is not None and time.monotonic() - self._used > self.IDLE_REOPEN:
            self._connection.close()
            self._connection = None
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
        try:
            self._connection.request(method, path, body=body, headers=headers or {})
            response = self._connection.getresponse()
            answer = response.status, dict(response.headers), response.read()
            self._used = time.monotonic()
            return answer
        except (OSError, http.client.HTTPException):
            self._connection.close()
            self._connection = None
            raise

    def json(self, method: str, path: str, document: object | None = None) -> object:
        body = json.dumps(document).encode() if document is not None else None
        status, _, raw = self.call(method, path, body, {"Content-Type": "application/json"} if body else None)
        _check_http(status, raw, f"{method} {path}")
        return json.loads(raw) if raw else None


# -- the workloads -----------------------------------------------------------------------------------
_X = np.random.default_rng(0).random((1, 784)).astype(np.float32)
_X16 = np.arange(16, dtype=np.float32).reshape(1, 16)


def _check_probabilities(values: np.ndarray, what: str) -> None:
    if values.shape != (1, 10) or abs(float(values.sum()) - 1.0) > 1e-3:
        raise Failure(f"{what}: wrong answer {values!r}")


def http_json(server: Server) -> Callable[[], None]:
    client = Http(server.port)
    document = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": _X.ravel().tolist()}]}

    def run() -> None:
        answer = client.json("POST", "/v2/models/tiny/infer", document)
        _check_probabilities(np.array(answer["outputs"][0]["data"], np.float32).reshape(1, 10), "http_json")  # type: ignore[index]

    return run


def http_binary(server: Server) -> Callable[[], None]:
    client = Http(server.port)
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                     "parameters": {"binary_data_size": _X.nbytes}}],
                         "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    body = header + _X.tobytes()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}

    def run() -> None:
        status, answer_headers, raw = client.call("POST", "/v2/models/tiny/infer", body, headers)
        _check_http(status, raw, "http_binary")
        length = int(answer_headers["Inference-Header-Content-Length"])
        _check_probabilities(np.frombuffer(raw[length:], np.float32).reshape(1, 10), "http_binary")

    return run


def grpc_infer(server: Server) -> Callable[[], None]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = grpcclient.InferInput("input", [1, 784], "FP32")
    tensor.set_data_from_numpy(_X)

    def run() -> None:
        try:
            result = client.infer("tiny", [tensor], client_timeout=60)
        except Exception as exc:  # noqa: BLE001 - classified
            raise _grpc_failure(exc, "grpc_infer") from None
        _check_probabilities(result.as_numpy("probabilities"), "grpc_infer")

    return run


def python_model(server: Server) -> Callable[[], None]:
    client = Http(server.port)
    document = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": _X16.ravel().tolist()}]}

    def run() -> None:
        answer = client.json("POST", "/v2/models/identity_python/infer", document)
        if answer["outputs"][0]["data"] != _X16.ravel().tolist():  # type: ignore[index]
            raise Failure(f"python_model: wrong answer {answer!r}"[:300])

    return run


def _burst_inputs(grpcclient) -> list:
    inputs = []
    for name, value in (("COUNT", STREAM_RESPONSES), ("SIZE", 16)):
        tensor = grpcclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(tensor)
    return inputs


def grpc_stream(server: Server) -> Callable[[], None]:
    """One long-lived stream, reopened every 60 requests."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    inputs = _burst_inputs(grpcclient)
    sent = [0]

    def run() -> None:
        if sent[0] % 60 == 0:
            if sent[0]:
                client.stop_stream()
            client.start_stream(callback=lambda result, error: answers.put(error))
        sent[0] += 1
        client.async_stream_infer("burst", inputs)
        for _ in range(STREAM_RESPONSES):
            try:
                error = answers.get(timeout=60)
            except queue.Empty:
                raise Failure("grpc_stream: a response did not arrive within 60 s") from None
            if error is not None:
                raise _grpc_failure(error, "grpc_stream")

    return run


def generate_stream(server: Server) -> Callable[[], None]:
    client = Http(server.port)
    body = json.dumps({"COUNT": STREAM_RESPONSES, "SIZE": 16}).encode()

    def run() -> None:
        status, _, raw = client.call("POST", "/v2/models/burst/generate_stream", body,
                                     {"Content-Type": "application/json"})
        _check_http(status, raw, "generate_stream")
        events = [line for line in raw.split(b"\n") if line.startswith(b"data: ")]
        if any(b'"error"' in event for event in events):
            raise Failure(f"generate_stream: {events!r}"[:300], server=True)
        if len(events) != STREAM_RESPONSES:
            raise Failure(f"generate_stream: {len(events)} events, expected {STREAM_RESPONSES}")

    return run


def sequences(server: Server) -> Callable[[], None]:
    """One whole sequence per call, alternately over HTTP and gRPC."""
    import tritonclient.grpc as grpcclient

    http_client = Http(server.port)
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    frame = np.random.default_rng(1).standard_normal((1, FRAME)).astype(np.float32)
    tensor = grpcclient.InferInput("input", [1, FRAME], "FP32")
    tensor.set_data_from_numpy(frame)
    count = [0]

    def run() -> None:
        count[0] += 1
        sequence_id = 1_000_000 + count[0]
        for step in range(SEQUENCE_STEPS):
            flags = {"sequence_start": step == 0, "sequence_end": step == SEQUENCE_STEPS - 1}
            if count[0] % 2:
                answer = http_client.json("POST", "/v2/models/vad/infer", {
                    "parameters": {"sequence_id": sequence_id, **flags},
                    "inputs": [{"name": "input", "shape": [1, FRAME], "datatype": "FP32",
                                "data": frame.ravel().tolist()}]})
                prob = float(answer["outputs"][0]["data"][0])  # type: ignore[index]
            else:
                try:
                    result = grpc_client.infer("vad", [tensor], sequence_id=sequence_id, client_timeout=60, **flags)
                except Exception as exc:  # noqa: BLE001 - classified
                    raise _grpc_failure(exc, "sequence") from None
                prob = float(result.as_numpy("prob").ravel()[0])
            if not 0.0 < prob < 1.0:
                raise Failure(f"sequence: probability {prob} out of (0, 1)")

    return run


def shared_memory_cycle(server: Server) -> Callable[[], None]:
    """Make, register, use, unregister and unlink two regions; alternately over HTTP and gRPC."""
    import tritonclient.grpc as grpcclient

    client = Http(server.port)
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    count = [0]

    def run() -> None:
        count[0] += 1
        regions = {}
        names = {what: f"{REGION_PREFIX}{what}-{count[0]}" for what in ("in", "out")}
        over_grpc = count[0] % 2 == 0
        try:
            for what, name in names.items():
                regions[what] = shared_memory.SharedMemory(f"/{name}", create=True, size=_X16.nbytes)
                if over_grpc:
                    try:
                        grpc_client.register_system_shared_memory(name, f"/{name}", _X16.nbytes)
                    except Exception as exc:  # noqa: BLE001 - classified
                        raise _grpc_failure(exc, "shm register") from None
                else:
                    client.json("POST", f"/v2/systemsharedmemory/region/{name}/register",
                                {"key": f"/{name}", "offset": 0, "byte_size": _X16.nbytes})
            np.ndarray(_X16.shape, np.float32, buffer=regions["in"].buf)[:] = _X16
            client.json("POST", "/v2/models/identity_onnx/infer", {
                "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {
                    "shared_memory_region": names["in"], "shared_memory_byte_size": _X16.nbytes}}],
                "outputs": [{"name": "OUTPUT0", "parameters": {
                    "shared_memory_region": names["out"], "shared_memory_byte_size": _X16.nbytes}}]})
            got = np.ndarray(_X16.shape, np.float32, buffer=regions["out"].buf).copy()
            if not np.array_equal(got, _X16):
                raise Failure(f"shared memory: wrong answer {got!r}")
        finally:
            for what, name in names.items():
                if what not in regions:
                    continue
                try:
                    if over_grpc:
                        grpc_client.unregister_system_shared_memory(name)
                    else:
                        client.json("POST", f"/v2/systemsharedmemory/region/{name}/unregister", {})
                finally:
                    regions[what].close()
                    regions[what].unlink()

    return run


def reads(server: Server) -> Callable[[], None]:
    client = Http(server.port)
    paths = [("GET", "/v2/health/ready"), ("GET", "/v2/models/tiny"), ("GET", "/v2/models/stats"),
             ("GET", "/metrics"), ("POST", "/v2/repository/index"), ("GET", "/v2/models/vad/config")]
    count = [0]

    def run() -> None:
        method, path = paths[count[0] % len(paths)]
        count[0] += 1
        status, _, raw = client.call(method, path, b"{}" if method == "POST" else None,
                                     {"Content-Type": "application/json"} if method == "POST" else None)
        if path == "/v2/health/ready" and status == 503:
            return  # an answer, not a failure: not ready while a model (re)loads (strict_readiness, as Triton)
        _check_http(status, raw, f"{method} {path}")

    return run


def reload_tiny(server: Server) -> Callable[[], None]:
    client = Http(server.port)

    def run() -> None:
        client.json("POST", "/v2/repository/models/tiny/load", {})

    return run


def cycle_spare(server: Server) -> Callable[[], None]:
    client = Http(server.port)

    def run() -> None:
        client.json("POST", "/v2/repository/models/spare/unload", {})
        client.json("POST", "/v2/repository/models/spare/load", {})

    return run


def push(server: Server, repo: Path) -> Callable[[], None]:
    client = Http(server.port)
    files = {"file:1/model.onnx": base64.b64encode((repo / "identity_onnx" / "1" / "model.onnx").read_bytes()).decode()}
    config = json.dumps({"backend": "onnxruntime", "max_batch_size": 16})

    def run() -> None:
        client.json("POST", "/v2/repository/models/pushed/load", {"parameters": {"config": config, **files}})
        answer = client.json("POST", "/v2/models/pushed/infer", {
            "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": _X16.ravel().tolist()}]})
        if answer["outputs"][0]["data"] != _X16.ravel().tolist():  # type: ignore[index]
            raise Failure("pushed model: wrong answer")

    return run


def workloads(server: Server, repo: Path) -> dict[str, tuple[float, Callable[[], None]]]:
    """Name -> (calls per second at --rate 1, one call)."""
    return {
        "http_json": (3.0, http_json(server)),
        "http_binary": (2.0, http_binary(server)),
        "grpc_infer": (3.0, grpc_infer(server)),
        "python_model": (2.0, python_model(server)),
        "grpc_stream": (1.0, grpc_stream(server)),
        "generate_stream": (0.5, generate_stream(server)),
        "sequence": (0.25, sequences(server)),
        "shared_memory": (0.5, shared_memory_cycle(server)),
        "reads": (1.0, reads(server)),
        "reload": (1 / 30, reload_tiny(server)),
        "unload_load": (1 / 120, cycle_spare(server)),
        "push": (1 / 300, push(server, repo)),
    }


def _drive(kind: str, per_second: float, call: Callable[[], None], tally: Tally, stop: threading.Event) -> None:
    """Calls at a steady pace (a late call is made at once; the schedule does not catch up in a burst)."""
    period = 1.0 / per_second
    due = time.monotonic() + period * (zlib.crc32(kind.encode()) % 100) / 100  # spread the kinds' phases
    while not stop.wait(max(0.0, due - time.monotonic())):
        try:
            call()
            tally.record(kind, None)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and listed
            tally.record(kind, exc)
        due = max(due + period, time.monotonic() - period)


# -- sampling ----------------------------------------------------------------------------------------
def _directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def sample(pid: int, state: Path) -> dict[str, float]:
    process = psutil.Process(pid)
    children = process.children(recursive=True)
    pids = {pid, *(child.pid for child in children)}
    shm = 0
    for entry in os.scandir("/dev/shm"):
        owner = entry.name.removeprefix("appliance-").split("-", 1)[0]
        mine = entry.name.startswith(REGION_PREFIX) or (entry.name.startswith("appliance-") and owner.isdigit()
                                                         and int(owner) in pids)
        if mine:
            try:
                shm += entry.stat().st_blocks * 512
            except FileNotFoundError:
                continue
    children_rss = 0
    for child in children:
        try:
            children_rss += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    sqlite = sum(p.stat().st_size for p in state.glob("metrics.db*") if p.is_file())
    return {
        "rss_mib": process.memory_info().rss / 2**20,
        "children_rss_mib": children_rss / 2**20,
        "fds": float(process.num_fds()),
        "threads": float(process.num_threads()),
        "dev_shm_mib": shm / 2**20,
        "sqlite_mib": sqlite / 2**20,
        "pushed_mib": _directory_bytes(state / "pushed") / 2**20,
    }


# -- the verdict -------------------------------------------------------------------------------------
def trend(times_h: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope (per hour) and the standard deviation of the residuals around the line."""
    mean_t, mean_v = statistics.fmean(times_h), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times_h)
    slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_h, values)) / spread if spread else 0.0
    residuals = [v - (mean_v + slope * (t - mean_t)) for t, v in zip(times_h, values)]
    return slope, statistics.pstdev(residuals)


def judge(samples: list[dict], warmup_s: float) -> dict[str, dict]:
    """Per series: slope per hour after the warm-up, the growth it makes over the measured span, the
    noise allowed, and whether the growth stays within it (None: too few samples to say)."""
    kept = [s for s in samples if s["t"] >= warmup_s]
    verdicts: dict[str, dict] = {}
    for name, floor in FLOORS.items():
        if len(kept) < 3:
            verdicts[name] = {"met": None, "samples": len(kept)}
            continue
        times = [s["t"] / 3600 for s in kept]
        values = [s[name] for s in kept]
        slope, noise = trend(times, values)
        growth = slope * (times[-1] - times[0])
        allowed = max(3 * noise, floor)
        verdicts[name] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
                          "slope_per_hour": slope, "growth": growth, "allowed": allowed, "met": growth <= allowed,
                          "samples": len(kept)}
    return verdicts


def report(args: argparse.Namespace, samples: list[dict], tally: Tally, loads: dict, died: str | None) -> str:
    verdicts = judge(samples, args.warmup_minutes * 60)
    lines = [
        f"Command: python -m bench.soak --minutes {args.minutes:g} --warmup-minutes {args.warmup_minutes:g} "
        f"--rate {args.rate:g} --sample-every {args.sample_every:g}",
        "",
        f"Load average (1, 5, 15 min) at start {loads['start']}, at end {loads['end']}; "
        f"{len(samples)} samples, the first {args.warmup_minutes:g} min are warm-up.",
        "",
        "| series | after warm-up | at end | min..max | slope per hour | growth over the span | allowed (noise) "
        "| target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, verdict in verdicts.items():
        unit = UNITS[name]
        if verdict["met"] is None:
            lines.append(f"| {name} | - | - | - | - | - | - | n/a ({verdict['samples']} samples after warm-up) |")
            continue
        lines.append(
            f"| {name} | {verdict['first']:.1f} {unit} | {verdict['last']:.1f} "
            f"| {verdict['min']:.1f}..{verdict['max']:.1f} "
            f"| {verdict['slope_per_hour']:+.2f} | {verdict['growth']:+.2f} | {verdict['allowed']:.2f} "
            f"| {'met' if verdict['met'] else 'MISSED'} |")
    total_ok, total_failed = sum(tally.ok.values()), sum(tally.failed.values())
    kinds = sorted(set(tally.ok) | set(tally.failed))
    per_kind = ", ".join(f"{k} {tally.ok[k]}/{tally.ok[k] + tally.failed[k]}" for k in kinds)
    lines += ["", f"Requests: {total_ok} succeeded, {total_failed} failed ({per_kind})."]
    lines.append(f"- {'met' if not tally.server_errors else 'MISSED'}: no 5xx (server errors: "
                 f"{len(tally.server_errors)})")
    lines.append(f"- {'met' if not tally.other_errors else 'MISSED'}: no other failure (4xx, wrong answers, "
                 f"dropped connections: {len(tally.other_errors)})")
    measured = [v for v in verdicts.values() if v["met"] is not None]
    growth_ok = bool(measured) and all(v["met"] for v in measured)
    lines.append(f"- {'met' if growth_ok else 'MISSED'}: no growth beyond noise after warm-up "
                 f"({sum(1 for v in measured if v['met'])}/{len(FLOORS)} series within it)")
    if died:
        lines.append(f"- MISSED: the daemon exited during the soak: {died}")
    for entry in (tally.server_errors + tally.other_errors)[:30]:
        lines.append(f"  - t={entry['t']} s {entry['kind']}: {entry['error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the soak (default 60)")
    parser.add_argument("--warmup-minutes", type=float, default=10.0,
                        help="minutes left out of the slopes (default 10)")
    parser.add_argument("--rate", type=float, default=1.0, help="scales every workload's rate (default 1.0)")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where soak.md and soak.json go")
    args = parser.parse_args()
    os.environ.update(HISTORY_ENV)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    repo = write_soak_repository(work / "repo")
    state = work / "state"
    server = start_appliance(repo, state, "--no-selection", "--model-control-mode", "explicit",
                             *(f"--load-model={name}" for name in MODELS))
    loads = {"start": tuple(round(x, 2) for x in os.getloadavg())}
    started = time.monotonic()
    tally = Tally(started)
    stop = threading.Event()
    samples: list[dict] = []
    died: str | None = None
    threads = [threading.Thread(target=_drive, args=(kind, rate * args.rate, call, tally, stop), name=kind, daemon=True)
               for kind, (rate, call) in workloads(server, repo).items()]
    for thread in threads:
        thread.start()
    try:
        end = started + args.minutes * 60
        next_sample = started
        while time.monotonic() < end:
            time.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
            if server.process.poll() is not None:
                died = f"exit status {server.process.returncode}"
                break
            if time.monotonic() >= next_sample:
                taken = {"t": round(time.monotonic() - started, 1), **sample(server.process.pid, state),
                         "load1": os.getloadavg()[0], "ok": sum(tally.ok.values()),
                         "failed": sum(tally.failed.values())}
                samples.append(taken)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in taken.items()}),
                      file=sys.stderr, flush=True)
                with tally.lock:
                    failures = {"server_errors": list(tally.server_errors), "other_errors": list(tally.other_errors)}
                (args.out / "soak.json").write_text(json.dumps({"samples": samples, **failures}, indent=1))
                next_sample += args.sample_every
    except KeyboardInterrupt:
        died = died or None
        print("interrupted: reporting what was measured", file=sys.stderr)
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
        loads["end"] = tuple(round(x, 2) for x in os.getloadavg())
        if server.process.poll() is None:
            server.stop()
    text = report(args, samples, tally, loads, died)
    (args.out / "soak.md").write_text(text)
    (args.out / "soak.json").write_text(json.dumps({
        "samples": samples, "verdicts": judge(samples, args.warmup_minutes * 60), "ok": dict(tally.ok),
        "failed": dict(tally.failed), "server_errors": tally.server_errors, "other_errors": tally.other_errors,
        "load_average": loads, "daemon_exited": died, "id": uuid.uuid4().hex[:8]}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
