"""A fleet of four daemons, run inside a private network namespace (see test_fleet.py); prints what it
saw as JSON on its last line.

box-a is killed (SIGKILL: no goodbye) half-way through the requests; box-b is saturated: it takes one
request at a time (APPLIANCE_MAX_CONCURRENT_REQUESTS=1) and answers 503 with Retry-After beyond it; box-c and
box-d are plain. Model "m" is pushed to every box (--all: refused while the boxes are not pinned, then
pinned with `appliance fleet trust --all`), model "n" only to box-a and box-c. A live BoxPool (mDNS)
sends 3,000 requests from 8 threads, one in ten for "n".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import re
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

from appliance.client import AsyncBoxPool, BoxPool
from tests.appliance.mdns.scenario import stop_all
from tests.builders import affine_model, save
from tests.models import copy_model
from tests.waiting import await_until, wait_until

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
            [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
             "--host", LOOPBACK, "--http-port", "0", "--grpc-port", "0",
             "--no-selection", "--state-dir", str(state), "--model-repository", str(repo), "--name", name,
             "--mdns-interface", LOOPBACK, *extra],
            stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return process, log


def wait_started(process: subprocess.Popen, log: Path) -> int:
    def started() -> int | bool | None:
        text = log.read_text()
        port = re.search(r"serving KServe v2 on https?://127\.0\.0\.1:(\d+)", text)  # over TLS too
        if port and "announcing" in text and "ready:" in text:
            return int(port.group(1))
        return process.poll() is not None  # True: it exited

    found = None
    with contextlib.suppress(AssertionError):
        found = wait_until(started, timeout=120, what="the daemon to announce itself", interval=0.1)
    if found is True or found is None:
        raise RuntimeError(log.read_text())
    return found


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


def model_dirs(work: Path) -> tuple[Path, Path]:
    """m (tests/models/fleet/steady: y = 2x, 4 ms a request) and n (ONNX, y = 5x over [batch, 8])."""
    m_dir, n_dir = work / "push" / "m", work / "push" / "n"
    copy_model(m_dir.parent, "fleet/steady", "m")
    save(affine_model(5.0, 0), n_dir / "1" / "model.onnx")
    (n_dir / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    return m_dir, n_dir


def tensor(model: str, value: float) -> triton.InferInput:
    shape = [2] if model == "m" else [1, 8]
    made = triton.InferInput("x", shape, "FP32")
    made.set_data_from_numpy(np.full(shape, value, np.float32))
    return made


def answer(result, model: str) -> float:
    return float(result.as_numpy("y").ravel()[0])


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
        try:
            value = answer(pool.infer(model, [tensor(model, index % 7)]), model)
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


def wait_for(condition: Callable[[], bool], seconds: float) -> float | None:
    """Seconds until ``condition`` held (None: it did not within ``seconds``)."""
    started = time.monotonic()
    try:
        wait_until(condition, timeout=seconds, interval=0.1)
    except AssertionError:
        return None
    return round(time.monotonic() - started, 2)


def coming_and_going(pool: BoxPool, work: Path, processes: dict[str, subprocess.Popen], m_dir: Path) -> dict:
    """The live pool follows the LAN: a box that stops (goodbye) leaves it, a new box joins it, and its
    models are read again when a push changes them."""
    seen: dict = {}
    processes["box-b"].send_signal(signal.SIGTERM)
    seen["b_left_after"] = wait_for(lambda: "box-b" not in pool.stats(), 15)
    process, log = launch("box-e", work)
    processes["box-e"] = process
    wait_started(process, log)
    seen["e_joined_after"] = wait_for(lambda: pool.stats().get("box-e", {}).get("models") is not None, 15)
    seen["e_models_before_push"] = pool.stats().get("box-e", {}).get("models")
    seen["trust_e"] = cli("fleet", "trust", "box-e", "--mdns-interface", LOOPBACK).returncode
    seen["push_e"] = cli("push", str(m_dir), "--to", "box-e", "--mdns-interface", LOOPBACK).returncode
    seen["e_models_read_after"] = wait_for(lambda: pool.stats()["box-e"]["models"] == ["m"], 15)

    def one(index: int) -> float:
        return answer(pool.infer("m", [tensor("m", 1.0)]), "m")

    with ThreadPoolExecutor(THREADS) as executor:
        seen["answers"] = sorted(set(executor.map(one, range(200))))
    seen["served"] = {name: s["served"].get("m", 0) for name, s in pool.stats().items()}
    return seen


async def async_requests() -> dict:
    """AsyncBoxPool, following the LAN too: 200 requests from 200 tasks."""
    async with AsyncBoxPool(interfaces=(LOOPBACK,)) as pool:
        with contextlib.suppress(AssertionError):  # the requests below say what is missing
            await await_until(lambda: any(s["models"] for s in pool.stats().values()), timeout=20,
                              what="a box with its models", interval=0.1)

        async def one() -> float:
            return answer(await pool.infer("m", [tensor("m", 2.0)]), "m")

        answers = await asyncio.gather(*(one() for _ in range(200)), return_exceptions=True)
        return {"answers": sorted({str(a) for a in answers}),
                "served": {name: s["served"].get("m", 0) for name, s in pool.stats().items()}}


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
        m_dir, n_dir = model_dirs(work)

        # The CLI's pins go to the scenario's directory (the default is the user's data dir).
        os.environ["APPLIANCE_TRUSTED_BOXES"] = str(work / "trusted-boxes.json")
        unpinned = cli("push", str(m_dir), "--all", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["push_unpinned"] = {"rc": unpinned.returncode, "stdout": unpinned.stdout, "stderr": unpinned.stderr}
        trusted = cli("fleet", "trust", "--all", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["trust_all"] = {"rc": trusted.returncode, "stdout": trusted.stdout, "stderr": trusted.stderr}
        push_all = cli("push", str(m_dir), "--all", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["push_all"] = {"rc": push_all.returncode, "stdout": push_all.stdout, "stderr": push_all.stderr}
        push_some = cli("push", str(n_dir), "--to", "box-a", "--to", "box-c", "--mdns-interface", LOOPBACK)
        result["push_some"] = {"rc": push_some.returncode, "stdout": push_some.stdout, "stderr": push_some.stderr}
        push_unknown = cli("push", str(n_dir), "--to", "box-z", "--mdns-interface", LOOPBACK, "--timeout", "2")
        result["push_unknown"] = {"rc": push_unknown.returncode, "stderr": push_unknown.stderr}
        result["index"] = {name: {row["name"]: row.get("origin") for row in call(port, "POST", "/v2/repository/index",
                                                                                   {})[1]}  # type: ignore[union-attr]
                           for name, port in ports.items()}
        result["hostile"] = hostile(ports["box-d"], n_dir)
        result["box_d_files"] = pushed_files(work, "box-d")
        result["escaped"] = [str(p) for p in (work / "escape", Path("/tmp/appliance-fleet-escape")) if p.exists()]

        with BoxPool(interfaces=(LOOPBACK,), cooldown=60) as pool:
            def found() -> bool:  # the pool finds the boxes over mDNS and reads their models
                known = pool.stats()
                return len(known) == 4 and all(s["models"] for s in known.values())

            with contextlib.suppress(AssertionError):  # the test says which models are missing
                wait_until(found, timeout=30, what="the four boxes and their models", interval=0.1)
            result["pool_models"] = {name: s["models"] for name, s in pool.stats().items()}
            result["run"] = run_requests(pool, lambda: processes["box-a"].send_signal(signal.SIGKILL))
            result["pool"] = pool.stats()
            result["served"] = {name: {"m": stats(ports[name], "m"), "n": stats(ports[name], "n")}
                                for name in ("box-b", "box-c", "box-d")}
            result["coming_and_going"] = coming_and_going(pool, work, processes, m_dir)
        result["async_pool"] = asyncio.run(async_requests())
        fleet = cli("fleet", "--json", "--mdns-interface", LOOPBACK, "--timeout", "3")
        result["fleet"] = json.loads(fleet.stdout) if fleet.returncode == 0 else fleet.stderr
        status, panel = call(ports["box-c"], "GET", "/v2/fleet")
        result["panel"] = panel
        with urllib.request.urlopen(f"http://{LOOPBACK}:{ports['box-c']}/", timeout=10) as page:
            result["dashboard_has_panel"] = b'id="fleet"' in page.read()
    finally:
        stop_all(processes.values(), work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
