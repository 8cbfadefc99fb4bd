"""Run inside a private network namespace (see test_discovery.py): daemons announce on 127.0.0.1 only,
discovery listens on 127.0.0.1 only; prints what it saw as JSON."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from appliance.client import BoxPool, discover
from appliance.examples import mlp_model
from tests.builders import affine_model, save, write_model
from tests.waiting import wait_until

LOOPBACK = ("127.0.0.1",)


def start(name: str, repo: Path, state: Path) -> tuple[subprocess.Popen, dict[str, int], Path]:
    log = state / f"{name}.log"
    state.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as output:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
             "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
             "--no-selection", "--no-metrics", "--state-dir", str(state), "--model-repository", str(repo), "--name",
             name, "--mdns-interface", "127.0.0.1"],
            stdout=output, stderr=subprocess.STDOUT)
    def ports() -> dict[str, int] | None:
        text = log.read_text()
        port = re.search(r"serving KServe v2 on http://127\.0\.0\.1:(\d+)", text)
        grpc = re.search(r"serving KServe v2 over gRPC on 127\.0\.0\.1:(\d+)", text)
        if port and grpc and "announcing" in text and "ready:" in text:
            return {"http": int(port.group(1)), "grpc": int(grpc.group(1))}
        return None

    try:
        return process, wait_until(ports, timeout=60, what=f"{name} to announce itself", interval=0.1), log
    except AssertionError:
        raise RuntimeError(log.read_text()) from None


def stop_all(processes: Iterable[subprocess.Popen], work: Path) -> None:
    """Stop the daemons still running and remove the scenario's temporary directory."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
            process.wait(30)
    shutil.rmtree(work, ignore_errors=True)


def snapshot() -> dict[str, dict]:
    return {b.name: {"port": b.port, "grpc": b.grpc_port, "models": b.models, "hw": b.hw,
                     "addresses": list(b.addresses), "version": b.version, "id": b.id} for b in discover(2.5, LOOPBACK)}


def main() -> None:
    work = Path(tempfile.mkdtemp())
    result: dict = {}
    repo_a, repo_b = work / "repo-a", work / "repo-b"
    save(mlp_model(), repo_a / "mlp" / "1" / "model.onnx")
    save(mlp_model(), repo_b / "mlp" / "1" / "model.onnx")
    a, port_a, _ = start("box-a", repo_a, work / "state-a")
    b, port_b, log_b = start("box-b", repo_b, work / "state-b")
    try:
        result["ports"] = {"box-a": port_a["http"], "box-b": port_b["http"]}
        result["grpc_ports"] = {"box-a": port_a["grpc"], "box-b": port_b["grpc"]}
        result["both"] = snapshot()
        cli = subprocess.run([sys.executable, "-m", "appliance", "discover", "--json", "--timeout", "2.5",
                              "--mdns-interface", "127.0.0.1"], capture_output=True, text=True, check=True)
        result["cli"] = json.loads(cli.stdout)

        # A model load changes the record's "models".
        write_model(repo_a, "affine", affine_model(1, 0))
        a.send_signal(signal.SIGHUP)

        def reannounced() -> dict | None:
            found = snapshot()
            return found if found.get("box-a", {}).get("models") == 2 else None

        try:
            result["after_load"] = wait_until(reannounced, timeout=30, what="box-a's record with the new model")
        except AssertionError:
            result["after_load"] = snapshot()  # the test says what the records lack

        # Same name as an existing box: resolved to "box-a (2)".
        c, port_c, log_c = start("box-a", repo_b, work / "state-c")
        result["conflict"] = snapshot()
        result["conflict_log"] = [line for line in log_c.read_text().splitlines() if "announcing" in line]
        c.terminate()
        c.wait(30)

        # Requests spread over the boxes; a box that stops answering is dropped.
        import numpy as np
        import tritonclient.grpc as triton_grpc
        import tritonclient.http as triton

        boxes = [box for box in discover(2.5, LOOPBACK) if box.name in ("box-a", "box-b")]
        pool = BoxPool(boxes, cooldown=60)
        tensor = triton.InferInput("input", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), np.float32))
        result["pool_before"] = [pool.infer("mlp", [tensor]).as_numpy("probabilities").shape[1] for _ in range(4)]
        grpc_pool = BoxPool(boxes, "grpc", cooldown=60)
        grpc_tensor = triton_grpc.InferInput("input", [1, 784], "FP32")
        grpc_tensor.set_data_from_numpy(np.zeros((1, 784), np.float32))

        def over_grpc() -> list[int]:
            return [grpc_pool.infer("mlp", [grpc_tensor]).as_numpy("probabilities").shape[1] for _ in range(4)]

        def concurrently(pool: BoxPool, tensor) -> list[int]:
            # Requests at once, so that the pool (which prefers the box with fewer requests outstanding
            # and the lower latency) sends some to every box it believes up.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(4) as executor:
                return list(executor.map(
                    lambda _: pool.infer("mlp", [tensor]).as_numpy("probabilities").shape[1], range(16)))

        def until_dropped(pool: BoxPool, tensor) -> list[str]:
            # The pool tries a box it measured slower only once that estimate, refreshed by nothing, has
            # decayed (seconds): keep sending until it has tried the stopped box, or 45 s went by.
            def dropped() -> bool:
                if [box.name for box in pool.healthy()] == ["box-a"]:
                    return True
                concurrently(pool, tensor)
                return False

            with contextlib.suppress(AssertionError):  # the test says which boxes the pool still holds
                wait_until(dropped, timeout=45, what="the stopped box dropped", interval=0.5)
            return [box.name for box in pool.healthy()]

        result["grpc_pool_before"] = over_grpc()

        # Shutdown sends goodbye: box-b disappears from discovery.
        b.send_signal(signal.SIGTERM)
        result["b_exit"] = b.wait(30)
        result["b_log_goodbye"] = "mDNS records withdrawn" in log_b.read_text()
        result["after_stop"] = snapshot()
        result["pool_after"] = concurrently(pool, tensor)[:4]
        result["pool_healthy"] = until_dropped(pool, tensor)
        result["grpc_pool_after"] = concurrently(grpc_pool, grpc_tensor)[:4]
        result["grpc_pool_healthy"] = until_dropped(grpc_pool, grpc_tensor)
    finally:
        stop_all((a, b), work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
