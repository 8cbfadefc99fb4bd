"""A real tritonserver on a model repository, on loopback only, started and stopped cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.oracle.install import TritonInstall, TritonUnavailable, install
from tests.waiting import wait_until

__all__ = ["TritonServer", "free_port"]

_LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback free right now (the server binds it a moment later; start() retries)."""
    with socket.socket() as probe:
        probe.bind((_LOOPBACK, 0))
        return probe.getsockname()[1]


class TritonServer:
    """``tritonserver`` serving ``repository`` on 127.0.0.1 (HTTP, gRPC, and metrics only if asked).

    Use as a context manager or call start()/stop(). ``model_control`` is Triton's
    --model-control-mode; ``args`` are appended to the command line (e.g. ``--load-model=*``,
    ``--trace-config=...``). ``pid`` is the server's process (its stubs are its children).
    """

    def __init__(self, repository: Path, *, model_control: str = "none", args: Sequence[str] = (),
                 log_path: Path | None = None, metrics: bool = False, triton: TritonInstall | None = None,
                 ready_timeout: float = 120, exit_timeout_s: int = 5) -> None:
        self.repository = Path(repository)
        self.model_control = model_control
        self.args = list(args)
        self.log_path = Path(log_path) if log_path else self.repository.parent / "tritonserver.log"
        self.metrics = metrics
        self.triton = triton
        self.ready_timeout = ready_timeout
        self.exit_timeout_s = exit_timeout_s
        self.process: subprocess.Popen | None = None
        self.http_port = self.grpc_port = 0
        self.metrics_port: int | None = None

    # -- addresses -------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """host:port as tritonclient.http wants it."""
        return f"{_LOOPBACK}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port as tritonclient.grpc wants it."""
        return f"{_LOOPBACK}:{self.grpc_port}"

    @property
    def base(self) -> str:
        return f"http://{self.http_url}"

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://{_LOOPBACK}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise TritonUnavailable("tritonserver is not running (start() first)")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> TritonServer:
        """Start and wait until ready (every model loaded); raises TritonUnavailable with the log's tail."""
        last = ""
        for _ in range(3):  # a port taken between free_port() and the bind: try other ports
            self.launch()
            try:
                return self.wait_ready()
            except TritonUnavailable as error:
                last = str(error)
                self.stop()
                if "address already in use" not in last.lower():
                    break
        raise TritonUnavailable(last)

    def launch(self) -> TritonServer:
        """Start the process and return at once (wait_ready() later: start other servers meanwhile)."""
        triton = self.triton = self.triton or install()
        if not self.repository.is_dir():
            raise TritonUnavailable(f"model repository {self.repository} does not exist")
        self._spawn(triton)
        return self

    def wait_ready(self) -> TritonServer:
        """Wait until /v2/health/ready answers 200 (with mode none: every model loaded)."""
        if self.process is None:
            raise TritonUnavailable("tritonserver is not running (launch() first)")
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise TritonUnavailable(f"tritonserver exited with {process.returncode} at start-up: "
                                        f"{_tail(self.log())}")
            try:
                with urllib.request.urlopen(f"{self.base}/v2/health/ready", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        try:
            wait_until(ready, self.ready_timeout, "tritonserver's /v2/health/ready", interval=0.1)
        except AssertionError:
            raise TritonUnavailable(f"tritonserver was not ready within {self.ready_timeout:.0f} s: "
                                    f"{_tail(self.log())}") from None
        return self

    def stop(self) -> int | None:
        """SIGTERM, wait for the in-flight exit timeout, then kill what is left of its process group."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.exit_timeout_s + 15)
            except subprocess.TimeoutExpired:
                pass
        try:  # stubs outliving a killed server: its own session, so only what this started
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, triton: TritonInstall) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.metrics_port = free_port() if self.metrics else None
        command = [
            str(triton.tritonserver), f"--model-repository={self.repository}",
            f"--backend-directory={triton.backend_directory}", f"--model-control-mode={self.model_control}",
            f"--http-address={_LOOPBACK}", f"--http-port={self.http_port}",
            f"--grpc-address={_LOOPBACK}", f"--grpc-port={self.grpc_port}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        if self.metrics_port is None:
            command.append("--allow-metrics=false")
        else:
            command += ["--allow-metrics=true", "--allow-gpu-metrics=false", f"--metrics-address={_LOOPBACK}",
                        f"--metrics-port={self.metrics_port}"]
        command += self.args
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=triton.server_environment(), cwd=self.log_path.parent,
                                            start_new_session=True)


def _tail(text: str, lines: int = 12) -> str:
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith(("|", "+"))]
    return "\n".join(kept[-lines:])
