"""The appliance against the Python peers, side by side in one run (issue 49): MLServer, KServe, LitServe, BentoML.

    python -m bench.peers install   # each peer in a virtual environment of its own, outside the repository
    python -m bench.peers [--peers mlserver,kserve,litserve,bentoml] [--models tiny,cnn] [--protocols http,grpc]
                          [--concurrency 1,16] [--pinning pinned,unpinned] [--seconds 4] [--repeats 2]

Every server serves the same two ONNX models (bench/models.py: the tiny MLP, FP32[784] in, and the CNN,
FP32[3,112,112] in): each peer with onnxruntime on one intra-op thread, through a small adapter in
``bench/peer_servers`` in its own virtual environment; the appliance as ``make serve`` would run it (the
runtime, instances and threads its selection measures best on the cores it may use, dynamic batching
from the models' configs, statistics and metrics history on). Each peer is **tuned**: a few
configurations of its own knobs run side by side (``CONFIGS``: in-process or separate inference workers,
adaptive batching), and each line keeps the peer's best. Requests are the v2 JSON body over HTTP (wrk)
and, for the peers that speak the v2 gRPC protocol, tritonclient's ``ModelInferRequest`` with a raw input
(h2load). ``pinned``: every server started (and so tuned, where it tunes itself) with its whole process
tree on core 0, the load generator on core 1; ``unpinned``: nothing pinned. Each round measures every
server in turn (the order flips every round); CPU per request is each whole process tree's, from /proc
around the run. Target: the appliance's throughput ≥ 1.0× each peer's best on every line. Writes
bench/results/peers.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from bench.loadgen import Result, require_h2load, require_wrk, run_h2load, run_wrk
from bench.models import write_repository
from bench.process import Server, start_appliance
from bench.report import heading, publish
from bench.serving import _CNN, _JSON, _TINY, RESULTS, _grpc_body, _json_body
from bench.triton import tree_cpu_seconds
from tests.oracle import free_port

__all__ = ["CONFIGS", "PEERS", "Row", "best_of", "install", "main", "table"]

TARGET = 1.0
"""The appliance's throughput over each peer's best, at least."""
_ONNXRUNTIME = "onnxruntime==1.32.0"
PEERS = {
    "mlserver": ("mlserver==1.7.1", _ONNXRUNTIME, "uvloop==0.21.0"),
    "kserve": ("kserve==0.21.0", _ONNXRUNTIME),
    "litserve": ("litserve==0.2.19", _ONNXRUNTIME),
    "bentoml": ("bentoml==1.4.40", _ONNXRUNTIME),
}
"""Each peer's requirements, pinned: what ``install`` puts in its virtual environment. MLServer 1.7.1's
inference workers die at start under uvloop 0.22 and newer (``asyncio.get_event_loop()`` in a process
with no loop), so its uvloop is the last it works with."""
CONFIGS = {
    "mlserver": ("in-process", "workers=1", "batching"),
    "kserve": ("default",),
    "litserve": ("default", "batching"),
    "bentoml": ("default",),
}
"""The configurations of each peer that a run tries: ``in-process`` (MLServer's parallel_workers 0), a
separate inference worker (``workers=1``, MLServer's default), adaptive batching (up to 16 requests,
1 ms); KServe's server has no batching of its own and one worker is its default; BentoML's batching
takes arrays, not a v2 body (bench/peer_servers/bentoml_onnx.py)."""
MODELS = {"tiny": ("tiny", _TINY), "cnn": ("cnn_batched", _CNN)}
"""bench/models.py's models: the name every server serves them under, and the request tensor."""
_GRPC = frozenset({"appliance", "mlserver", "kserve"})
_SERVERS = Path(__file__).resolve().parent / "peer_servers"


def cache_directory() -> Path:
    """Where the peers' virtual environments live: $EDGE_APPLIANCE_PEERS_CACHE, else ~/.cache/edge-appliance/peers."""
    configured = os.environ.get("EDGE_APPLIANCE_PEERS_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "edge-appliance" / "peers"


def _python(peer: str) -> Path:
    return cache_directory() / peer / "bin" / "python"


def install(peers: Sequence[str]) -> None:
    """Each peer in its own virtual environment (its dependencies clash with the appliance's), once."""
    for peer in peers:
        marker = cache_directory() / peer / "installed.json"
        if marker.exists() and json.loads(marker.read_text()) == list(PEERS[peer]):
            continue
        print(f"installing {peer}: {' '.join(PEERS[peer])}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(cache_directory() / peer)], check=True)
        subprocess.run([str(_python(peer)), "-m", "pip", "install", "-q", *PEERS[peer]], check=True)
        marker.write_text(json.dumps(list(PEERS[peer])))


class PeerServer(Server):
    """A peer's server, stopped with every process it started: MLServer's and LitServe's workers, BentoML's
    supervisor's, outlive a terminated parent and would go on taking CPU from the servers measured next."""

    def stop(self) -> None:
        _stop_group(self.process)


def _stop_group(process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the group outlived its leader


def _spawn(command: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None,
           ) -> subprocess.Popen:
    """A peer's server in a process group of its own (``PeerServer.stop`` ends the whole group)."""
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _stop_group(process)
            raise RuntimeError(f"{url}: the server exited:\n{log.read_text()[-3000:]}")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    _stop_group(process)
    raise TimeoutError(f"{url} never became ready:\n{log.read_text()[-3000:]}")


def _start_mlserver(config: str, repo: Path, work: Path, prefix: tuple[str, ...]) -> Server:
    root = work
    shutil.copy(_SERVERS / "mlserver_onnx.py", root)
    http, grpc, metrics = free_port(), free_port(), free_port()
    (root / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics, "debug": False,
        "parallel_workers": 0 if config in ("in-process", "batching") else 1}))
    for name, _ in MODELS.values():
        settings: dict = {"name": name, "implementation": "mlserver_onnx.OnnxModel",
                          "parameters": {"uri": str(repo / name / "1" / "model.onnx")}}
        if config == "batching":
            settings.update(max_batch_size=16, max_batch_time=0.001)
        (root / name).mkdir()
        (root / name / "model-settings.json").write_text(json.dumps(settings))
    log = root / "server.log"
    process = _spawn([*prefix, str(cache_directory() / "mlserver" / "bin" / "mlserver"), "start", str(root)], log,
                     cwd=root)
    for name, _ in MODELS.values():
        _wait_ready(process, f"http://127.0.0.1:{http}/v2/models/{name}/ready", log)
    return PeerServer(process, http, grpc)


def _start_kserve(config: str, repo: Path, work: Path, prefix: tuple[str, ...]) -> Server:
    http, grpc = free_port(), free_port()
    log = work / "server.log"
    process = _spawn([*prefix, str(_python("kserve")), str(_SERVERS / "kserve_onnx.py"), str(http), str(grpc),
                      *(str(repo / name / "1" / "model.onnx") for name, _ in MODELS.values())], log)
    for name, _ in MODELS.values():
        _wait_ready(process, f"http://127.0.0.1:{http}/v2/models/{name}/ready", log)
    return PeerServer(process, http, grpc)


def _start_litserve(config: str, repo: Path, work: Path, prefix: tuple[str, ...]) -> Server:
    http = free_port()
    log = work / "server.log"
    process = _spawn([*prefix, str(_python("litserve")), str(_SERVERS / "litserve_onnx.py"), str(http),
                      "16" if config == "batching" else "1",
                      *(str(repo / name / "1" / "model.onnx") for name, _ in MODELS.values())], log)
    _wait_ready(process, f"http://127.0.0.1:{http}/health", log)
    return PeerServer(process, http)


def _start_bentoml(config: str, repo: Path, work: Path, prefix: tuple[str, ...]) -> Server:
    http = free_port()
    log = work / "server.log"
    models = ":".join(str(repo / name / "1" / "model.onnx") for name, _ in MODELS.values())
    process = _spawn([*prefix, str(cache_directory() / "bentoml" / "bin" / "bentoml"), "serve",
                      "bentoml_onnx:OnnxService", "--host", "127.0.0.1", "--port", str(http)], log, cwd=_SERVERS,
                     env={**os.environ, "BENCH_MODELS": models, "BENTOML_DO_NOT_TRACK": "True"})
    _wait_ready(process, f"http://127.0.0.1:{http}/readyz", log)
    return PeerServer(process, http)


_STARTERS = {"mlserver": _start_mlserver, "kserve": _start_kserve, "litserve": _start_litserve,
             "bentoml": _start_bentoml}


def _expected(repo: Path, served: str, tensor: tuple) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(repo / served / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run([tensor[1]], {tensor[0]: tensor[2]})[0]


def check_answers(server: Server, name: str, repo: Path, protocols: Sequence[str]) -> None:
    """Each model answered right over each protocol the server speaks, before any load: a server that
    answers errors or nonsense fast must not win a row (h2load does not read gRPC's status)."""
    import tritonclient.grpc as grpcclient

    for served, tensor in MODELS.values():
        expected = _expected(repo, served, tensor)
        request = urllib.request.Request(f"{server.base}/v2/models/{served}/infer", _json_body(tensor), _JSON)
        with urllib.request.urlopen(request, timeout=30) as answer:
            output = json.loads(answer.read())["outputs"][0]
        got = {"http": np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])}
        if "grpc" in protocols and name.split(":")[0] in _GRPC:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            feed = grpcclient.InferInput(tensor[0], list(tensor[2].shape), "FP32")
            feed.set_data_from_numpy(tensor[2])
            got["grpc"] = client.infer(served, [feed], outputs=[grpcclient.InferRequestedOutput(tensor[1])]
                                       ).as_numpy(tensor[1])
            client.close()
        for protocol, value in got.items():
            if value.shape != expected.shape or not np.allclose(value, expected, rtol=1e-4, atol=1e-5):
                raise RuntimeError(f"{name} answered {served} over {protocol} wrongly: {value.ravel()[:4]} ..., "
                                   f"expected {expected.ravel()[:4]} ...")


@dataclasses.dataclass(frozen=True)
class Row:
    """One load run against one server: what the table is made of."""

    server: str
    """``appliance`` or ``peer:config``."""
    pinning: str
    model: str
    protocol: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    cpu_us: float
    errors: int


def _measure(server: Server, name: str, pinning: str, model: str, protocol: str, concurrency: int,
             seconds: float) -> Row:
    served, tensor = MODELS[model]
    prefix = ("taskset", "-c", "1") if pinning == "pinned" else ()
    cpu_before = tree_cpu_seconds(server.process.pid)
    completed: int
    result: Result
    if protocol == "http":
        result = run_wrk(f"{server.base}/v2/models/{served}/infer", _json_body(tensor), _JSON, concurrency, seconds,
                         prefix=prefix)
        completed = result.requests
    else:
        body = _grpc_body(served, tensor)
        url = f"http://127.0.0.1:{server.grpc_port}/inference.GRPCInferenceService/ModelInfer"
        result, completed = run_h2load(url, body, concurrency, seconds, prefix=prefix)
    cpu = (tree_cpu_seconds(server.process.pid) - cpu_before) * 1e6 / completed if completed else float("nan")
    return Row(name, pinning, model, protocol, concurrency, result.requests_per_s, result.p50_ms, cpu, result.errors)


def _cases(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    for model in args.models:
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                yield model, protocol, concurrency


def _start_all(args: argparse.Namespace, repo: Path, work: Path, pinning: str) -> dict[str, Server]:
    """The appliance and every configuration of every peer, started (and so tuned, where a server tunes
    itself to the cores it may use) under ``pinning``: on core 0 alone, or unpinned."""
    prefix = ("taskset", "-c", "0") if pinning == "pinned" else ()
    servers: dict[str, Server] = {}
    try:
        servers["appliance"] = start_appliance(repo, work / f"state-{pinning}", prefix=prefix)
        for peer in args.peers:
            for config in CONFIGS[peer]:
                place = work / f"{pinning}-{peer}-{config}"
                place.mkdir()
                servers[f"{peer}:{config}"] = _STARTERS[peer](config, repo, place, prefix)
        for name, server in servers.items():
            check_answers(server, name, repo, args.protocols)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def measure(args: argparse.Namespace, work: Path) -> tuple[list[Row], list[float]]:
    """Every case against every server, round after round; the rows, and the load average at each run."""
    repo = write_repository(work / "repo")
    rows: list[Row] = []
    loads: list[float] = []
    for pinning in args.pinning:
        servers = _start_all(args, repo, work, pinning)
        try:
            for repeat in range(args.repeats):
                for model, protocol, concurrency in _cases(args):
                    order = list(servers) if repeat % 2 == 0 else list(reversed(servers))
                    for name in order:
                        if protocol == "grpc" and name.split(":")[0] not in _GRPC:
                            continue
                        server = servers[name]
                        _measure(server, name, pinning, model, protocol, concurrency, 1)  # warm-up
                        row = _measure(server, name, pinning, model, protocol, concurrency, args.seconds)
                        loads.append(os.getloadavg()[0])
                        print(f"  round {repeat + 1}/{args.repeats} {pinning:8s} {model:4s} {protocol:4s} "
                              f"c={concurrency:<2d} {name:20s} {row.requests_per_s:8.0f} req/s  p50 "
                              f"{row.p50_ms:7.3f} ms  {row.cpu_us:6.0f} µs CPU/req  errors {row.errors}", flush=True)
                        rows.append(row)
        finally:
            for server in servers.values():
                server.stop()
    return rows, loads


def best_of(rows: Sequence[Row], peer: str) -> tuple[str, float, float, int] | None:
    """The peer's best configuration on these rows (one case): its name, median req/s, median CPU µs/req and
    errors over the rounds. A configuration that answered errors (wrk's timeouts and non-2xx) is a tuning
    only where every configuration did."""
    found: dict[str, tuple[float, float, int]] = {}
    for name in {r.server for r in rows if r.server.split(":")[0] == peer}:
        mine = [r for r in rows if r.server == name]
        found[name] = (statistics.median(r.requests_per_s for r in mine), statistics.median(r.cpu_us for r in mine),
                       sum(r.errors for r in mine))
    if not found:
        return None
    clean = [name for name in found if not found[name][2]] or list(found)
    name = max(clean, key=lambda n: found[n][0])
    return name.split(":", 1)[1], *found[name]


def table(rows: Sequence[Row], peers: Sequence[str]) -> tuple[str, int, int]:
    """One line per case and peer: the appliance's and the peer's best (medians over the rounds), the
    throughput and CPU ratios, the errors of each, met/missed (an appliance that answered an error misses);
    and how many of the lines met the target, of how many."""
    lines = ["| pinning | model | protocol | c | peer (best config) | peer req/s | appliance req/s | × throughput | "
             "peer CPU µs/req | appliance CPU µs/req | × CPU | errors (appliance, peer) | ahead (≥ 1.0×) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    met = total = 0
    cases = sorted({(r.pinning, r.model, r.protocol, r.concurrency) for r in rows})
    for case in cases:
        mine = [r for r in rows if (r.pinning, r.model, r.protocol, r.concurrency) == case]
        ours = [r for r in mine if r.server == "appliance"]
        if not ours:
            continue
        throughput = statistics.median(r.requests_per_s for r in ours)
        cpu = statistics.median(r.cpu_us for r in ours)
        errors = sum(r.errors for r in ours)
        for peer in peers:
            best = best_of(mine, peer)
            if best is None:
                continue
            config, peer_throughput, peer_cpu, peer_errors = best
            ratio = throughput / peer_throughput if peer_throughput else float("inf")
            ahead = ratio >= TARGET and not errors
            total += 1
            met += ahead
            pinning, model, protocol, concurrency = case
            lines.append(f"| {pinning} | {model} | {protocol} | {concurrency} | {peer} ({config}) | "
                         f"{peer_throughput:.0f} | {throughput:.0f} | {ratio:.2f} | {peer_cpu:.0f} | {cpu:.0f} | "
                         f"{cpu / peer_cpu:.2f} | {errors}, {peer_errors} | {'met' if ahead else 'MISSED'} |")
    return "\n".join(lines), met, total


def _names(text: str, known: Sequence[str]) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}: choose from {', '.join(known)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("run", "install"), default="run")
    parser.add_argument("--peers", type=lambda t: _names(t, list(PEERS)), default=list(PEERS))
    parser.add_argument("--models", type=lambda t: _names(t, list(MODELS)), default=list(MODELS))
    parser.add_argument("--protocols", type=lambda t: _names(t, ["http", "grpc"]), default=["http", "grpc"])
    parser.add_argument("--pinning", type=lambda t: _names(t, ["pinned", "unpinned"]), default=["pinned", "unpinned"])
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=[1, 16])
    parser.add_argument("--seconds", type=float, default=4.0, help="each load run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds; medians are reported")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install(args.peers)
    if args.command == "install":
        print(f"peers installed in {cache_directory()}")
        return 0
    require_wrk()
    if "grpc" in args.protocols:
        require_h2load()
    started, before = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows, loads = measure(args, Path(tmp))
    text, met, total = table(rows, args.peers)
    publish(heading("bench.peers", argv, started, before, loads) + f"\n\n{text}\n\n"
            f"Ahead of every peer's best on {met} of {total} lines (target: all).", args.out, "peers.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
