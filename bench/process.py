"""Start the servers a benchmark measures, on 127.0.0.1 with ephemeral ports, and stop them."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["Server", "peak_rss_mib", "rss_mib", "start_appliance", "start_floor", "start_lean_reference"]


@dataclasses.dataclass
class Server:
    process: subprocess.Popen
    port: int
    grpc_port: int | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _wait_for(process: subprocess.Popen, log: Path, pattern: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text())
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(log.read_text())


def start_appliance(repo: Path, state: Path, *args: str, tree: Path | None = None,
                    env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> Server:
    """The daemon on ``repo``; ``tree``: run another checkout's code (an A/B against a commit before);
    ``env``: settings added to the environment; ``prefix`` wraps the command (e.g. ``prlimit --as=...``)."""
    state.mkdir(parents=True, exist_ok=True)
    log = state / "daemon.log"
    # ``python -m`` looks in the working directory first: the other tree is both cwd and PYTHONPATH.
    environment = {**os.environ, **(env or {})}
    if tree is not None:
        environment["PYTHONPATH"] = str(tree.resolve())
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
             "--host", "127.0.0.1", "--http-port", "0",
             "--grpc-port", "0", "--no-mdns", "--state-dir", str(state), "--model-repository", str(repo), *args],
            stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=None if tree is None else tree.resolve(),
        )
    port = _wait_for(process, log, r"serving KServe v2 on http://127\.0\.0\.1:(\d+)")
    grpc_port = None
    if "--no-grpc" not in args:
        grpc_port = _wait_for(process, log, r"serving KServe v2 over gRPC on 127\.0\.0\.1:(\d+)")
    server = Server(process, port, grpc_port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{server.base}/v2/health/ready", timeout=2).status == 200:
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"appliance never became ready:\n{log.read_text()}")


def start_floor(model: Path, *args: str) -> Server:
    log = model.parent / f"floor{'-'.join(args)}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "bench.floor", str(model), *args], stdout=out,
                                   stderr=subprocess.STDOUT)
    return Server(process, _wait_for(process, log, r"PORT (\d+)"))


def start_lean_reference(model_dir: Path, log: Path, *args: str, prefix: tuple[str, ...] = (),
                         env: dict[str, str] | None = None) -> Server:
    """bench.lean_reference serving the model in ``model_dir`` on 127.0.0.1, a free port; ``args``: its
    other options (``--token``); ``prefix`` wraps the command (``taskset -c 0``); ``env``: added to this
    process's environment."""
    with open(log, "w") as out:
        process = subprocess.Popen([*prefix, sys.executable, "-m", "bench.lean_reference", "--host", "127.0.0.1",
                                    "--port", "0", "--model-dir", str(model_dir), *args],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
                                   env={**os.environ, **(env or {})})
    return Server(process, _wait_for(process, log, r"lean reference serving \S+ on http://127\.0\.0\.1:(\d+)"))


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    return _status_mib(pid, "VmRSS")


def peak_rss_mib(pid: int) -> float:
    """The most resident memory process ``pid`` has had, in MiB (VmHWM)."""
    return _status_mib(pid, "VmHWM")


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")
