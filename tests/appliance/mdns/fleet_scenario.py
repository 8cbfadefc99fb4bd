"""A fleet of four daemons, run inside a private network namespace (see test_fleet.py); prints what it
saw as JSON on its last line.

box-a is killed (SIGKILL: no goodbye) half-way through the requests; box-b is saturated: it takes one
request at a time (APPLIANCE_MAX_CONCURRENT_REQUESTS=1) and answers 503 with Retry-After beyond it; box-c and
box-d are plain. Model "m" is pushed to every box (--all), model "n" only to box-a and box-c.
A live BoxPool (mDNS) sends 3,000 requests from 8 threads, one in ten for "n".
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as triton

from appliance.client import BoxPool
from tests.builders import affine_model, save

LOOPBACK = "127.0.0.1"
REQUESTS = 3000
THREADS = 8
NAMES = ("box-a", "box-b", "box-c", "box-d")


def launch(name: str, work: Path, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    state = work / f"state-{name}"
    repo = work / f"repo-{name}"
    state.mkdir(parents=True)
    repo.mkdir()
    log = state / "daemon.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--host", LOOPBACK, "--http-port", "0", "--grpc-port", "0",
             "--no-selection", "--state-dir", str(state), "--model-repository", str(repo), "--name", name,
             "--mdns-interface", LOOPBACK, *extra],
            stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return process, log


def wait_started(process: subprocess.Popen, log: Path) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log.read_text()
        port = re.search(r"serving KServe v2 on http://127\.0\.0\.1:(\d+)", text)
        if port and "announcing" in text and "ready:" in text:
            return int(port.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(log.read_text())


def call(port: int, method: str, path: str, body: dict | None = None, source: str | None = None,
         ) -> tuple[int, object]:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=30, source_address=(source, 0) if source else None)
    try:
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        connection.close()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=120)


def model_dir(work: Path, name: str, scale: float) -> Path:
    directory = work / "push" / name
    save(affine_model(scale, 0), directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    return directory


def pushed_files(work: Path, name: str) -> list[str]:
    root = work / f"state-{name}" / "pushed"
    return sorted(str(p.relative_to(root)).split("/", 1)[1] for p in root.rglob("*") if p.is_file())


def hostile(port: int, model: Path) -> dict:
    """Pushes box-d must refuse (4xx), and what they left on disk (nothing)."""
    config = '{"backend": "onnxruntime"}'
    onnx_b64 = base64.b64encode((model / "1" / "model.onnx").read_bytes()).decode()
    attempts = {
        "dotdot": ({"config": config, "file:../../escape/1/model.onnx": onnx_b64}, None),
        "absolute": ({"config": config, "file:/tmp/appliance-fleet-escape": onnx_b64}, None),
        "oversized": ({"config": config, "file:1/model.onnx": base64.b64encode(b"x" * 70000).decode()}, None),
        "no_token": ({"config": config, "file:1/model.onnx": onnx_b64}, "127.0.0.2"),
    }
    return {what: call(port, "POST", "/v2/repository/models/evil/load", {"parameters": parameters}, source)[0]
            for what, (parameters, source) in attempts.items()}


def stats(port: int, model: str) -> int | None:
    status, answer = call(port, "GET", f"/v2/models/{model}/stats")
    if status != 200:
        return None
    return sum(row["inference_stats"]["success"]["count"] for row in answer["model_stats"])  # type: ignore[index]


def run_requests(pool: BoxPool, kill: Callable[[], None]) -> dict:
    done = 0
    lock = threading.Lock()
    failures: list[str] = []
    killed_at: list[int] = []

    def one(index: int) -> None:
        nonlocal done
        model = "n" if index % 10 == 0 else "m"
        tensor = triton.InferInput("x", [1, 8], "FP32")
        tensor.set_data_from_numpy(np.full((1, 8), index % 7, np.float32))
        try:
            value = float(pool.infer(model, [tensor]).as_numpy("y")[0, 0])
            expected = (5.0 if model == "n" else 2.0) * (index % 7)
            if value != expected:
                failures.append(f"request {index}: {value} != {expected}")
        except Exception as exc:  # noqa: BLE001 - counted: the test expects none
            failures.append(f"request {index} ({model}): {type(exc).__name__}: {exc}")
        with lock:
            done += 1
            if done == REQUESTS // 2:
                kill()
                killed_at.append(done)

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as executor:
        list(executor.map(one, range(REQUESTS)))
    return {"seconds": round(time.monotonic() - started, 2), "failures": failures[:20], "failed": len(failures),
            "killed_at": killed_at}


def main() -> None:
    work = Path(tempfile.mkdtemp())
    result: dict = {}
    processes: dict[str, subprocess.Popen] = {}
    try:
        launched = {
            "box-a": launch("box-a", work),
            "box-b": launch("box-b", work, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": "1"}),
            "box-c": launch("box-c", work),
            "box-d": launch("box-d", work, "--push-max-file-bytes", "65536",
                            env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"}),
        }
        processes = {name: launched[name][0] for name in NAMES}
        ports = {name: wait_started(*launched[name]) for name in NAMES}
        result["ports"] = ports
        m_dir, n_dir = model_dir(work, "m", 2.0), model_dir(work, "n", 5.0)

        push_all = cli("push", str(m_dir), "--all", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["push_all"] = {"rc": push_all.returncode, "stdout": push_all.stdout, "stderr": push_all.stderr}
        push_some = cli("push", str(n_dir), "--to", "box-a", "--to", "box-c", "--mdns-interface", LOOPBACK)
        result["push_some"] = {"rc": push_some.returncode, "stdout": push_some.stdout, "stderr": push_some.stderr}
        push_unknown = cli("push", str(n_dir), "--to", "box-z", "--mdns-interface", LOOPBACK, "--timeout", "2")
        result["push_unknown"] = {"rc": push_unknown.returncode, "stderr": push_unknown.stderr}
        result["index"] = {name: {row["name"]: row.get("origin") for row in call(port, "POST", "/v2/repository/index",
                                                                                   {})[1]}  # type: ignore[union-attr]
                           for name, port in ports.items()}
        result["hostile"] = hostile(ports["box-d"], m_dir)
        result["box_d_files"] = pushed_files(work, "box-d")
        result["escaped"] = [str(p) for p in (work / "escape", Path("/tmp/appliance-fleet-escape")) if p.exists()]

        with BoxPool(interfaces=(LOOPBACK,), cooldown=60) as pool:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the pool finds the boxes over mDNS and reads their models
                known = pool.stats()
                if len(known) == 4 and all(s["models"] for s in known.values()):
                    break
                time.sleep(0.1)
            result["pool_models"] = {name: s["models"] for name, s in pool.stats().items()}
            result["run"] = run_requests(pool, lambda: processes["box-a"].send_signal(signal.SIGKILL))
            result["pool"] = pool.stats()
        result["served"] = {name: {"m": stats(ports[name], "m"), "n": stats(ports[name], "n")}
                            for name in ("box-b", "box-c", "box-d")}
        fleet = cli("fleet", "--json", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["fleet"] = json.loads(fleet.stdout) if fleet.returncode == 0 else fleet.stderr
        status, panel = call(ports["box-c"], "GET", "/v2/fleet")
        result["panel"] = panel
        with urllib.request.urlopen(f"http://{LOOPBACK}:{ports['box-c']}/", timeout=10) as page:
            result["dashboard_has_panel"] = b'id="fleet"' in page.read()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
                process.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
