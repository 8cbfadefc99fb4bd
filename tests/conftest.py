"""Shared fixtures: a daemon started as users start it (the CLI, 127.0.0.1, an ephemeral port, no mDNS)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.served import Addresses
from tests.waiting import wait_until

_BOUND = re.compile(r"serving KServe v2 on https?://127\.0\.0\.1:(\d+)")
_GRPC_BOUND = re.compile(r"serving KServe v2 over gRPC(?: \(TLS\))? on 127\.0\.0\.1:(\d+)")


@dataclass
class Daemon(Addresses):
    process: subprocess.Popen
    port: int
    log_path: Path
    extra: dict = field(default_factory=dict)
    grpc_port: int | None = None
    """None when the daemon serves no gRPC (--no-grpc)."""
    like: Callable[..., Daemon] | None = field(default=None, repr=False)
    """like(added) -> Daemon: starts another daemon like this one (its repository, arguments and
    environment, ``added`` on top; a state dir of its own), stopped with the factory's daemons."""

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _wait_for_port(process: subprocess.Popen, log_path: Path, deadline: float,
                   pattern: re.Pattern = _BOUND) -> int:
    def bound() -> int | None:
        match = pattern.search(log_path.read_text())
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            raise RuntimeError(f"daemon exited with {process.returncode}:\n{log_path.read_text()}")
        return None

    try:
        return wait_until(bound, timeout=max(deadline - time.monotonic(), 0.0), what="the daemon to bind",
                          interval=0.05)
    except AssertionError:
        raise TimeoutError(f"daemon did not bind in time:\n{log_path.read_text()}") from None


def _wait_until_loaded(base: str, log_path: Path, deadline: float) -> None:
    # The start-up load is over once the daemon logs it (the repository index is empty before the
    # load begins, so its lack of LOADING rows alone says nothing); LOADING rows after it mean a model
    # is still on its way.
    def loaded() -> bool:
        if "repository loaded:" not in log_path.read_text(errors="replace"):
            return False
        try:
            request = urllib.request.Request(base + "/v2/repository/index", data=b"{}", method="POST")
            return "LOADING" not in urllib.request.urlopen(request, timeout=2).read().decode()
        except OSError:
            return False

    try:
        wait_until(loaded, timeout=max(deadline - time.monotonic(), 0.0), what="the repository load",
                   interval=0.05)
    except AssertionError:
        raise TimeoutError("daemon did not finish loading its repository in time") from None


def _daemon_factory(tmp_path_factory) -> Iterator:
    started: list[Daemon] = []

    def start(repository: Path | None, *args: str, env: dict | None = None, wait_loaded: bool = True,
              selection: bool = False, state: Path | None = None, prefix: Sequence[str] = ()) -> Daemon:
        # Serving-path tests compare outputs with onnxruntime exactly, so by default they serve each
        # model with its config's backend; selection tests ask for measured selection. ``prefix`` wraps
        # the command (tests.readonly: a read-only state dir; the log, opened here, stays writable).
        state = state or tmp_path_factory.mktemp("state")
        state.mkdir(parents=True, exist_ok=True)
        log_path = state / f"daemon-{len(started)}.log"
        command = [*prefix, sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
                   "--host", "127.0.0.1", "--http-port", "0",
                   "--grpc-port", "0", "--state-dir", str(state), "--no-mdns", *args]
        if not selection:
            command.append("--no-selection")
        if repository is not None:
            command += ["--model-repository", str(repository)]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        # One kept probe report for the session's daemons (the box does not change under a test run): a
        # daemon start then skips seconds of runtime imports, as a restart on a real box does.
        environment["APPLIANCE_PROBE_CACHE_FILE"] = str(tmp_path_factory.getbasetemp() / "hardware-probe.json")
        environment.update(env or {})
        with open(log_path, "w") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment)

        def like(added: dict | None = None) -> Daemon:
            return start(repository, *args, env={**(env or {}), **(added or {})}, wait_loaded=wait_loaded,
                         selection=selection, prefix=prefix)

        daemon = Daemon(process, 0, log_path, like=like)
        started.append(daemon)
        deadline = time.monotonic() + 60
        daemon.port = _wait_for_port(process, log_path, deadline)
        if "--no-grpc" not in args and (env or {}).get("APPLIANCE_GRPC", "true") != "false":
            daemon.grpc_port = _wait_for_port(process, log_path, deadline, _GRPC_BOUND)
        if wait_loaded:
            _wait_until_loaded(daemon.base, log_path, deadline)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


# Fixtures that start a real daemon (a process, or served in the test process: tests/inprocess.py), or
# install real Triton to start it (tests/oracle): a test using one is end to end (marked e2e), as is
# every test in a *_e2e.py module (those start daemons or model processes of their own).
_DAEMON_FIXTURES = frozenset({"start_daemon", "module_daemon", "daemon", "client", "triton_install",
                              "serve_in_process", "module_in_process"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test e2e when it starts a daemon, so ``-m "not e2e"`` (make test-fast) leaves them out;
    ``slow`` and ``gpu`` are set by the modules themselves."""
    e2e = pytest.mark.e2e
    for item in items:
        if item.path.name.endswith("_e2e.py") or _DAEMON_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(e2e)


@pytest.fixture
def start_daemon(tmp_path_factory) -> Iterator:
    """Factory: start_daemon(repository, *extra_args, env=None) -> Daemon; stopped after the test."""
    yield from _daemon_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def module_daemon(tmp_path_factory) -> Iterator:
    """The same factory, with daemons shared by a test module."""
    yield from _daemon_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    """The module's daemon, serving the module's own ``repository`` fixture."""
    return module_daemon(repository)


@pytest.fixture(scope="module")
def client(daemon):
    import tritonclient.http as triton

    with triton.InferenceServerClient(daemon.url) as client:
        yield client


@pytest.fixture
def shm_object() -> Iterator:
    """Factory: shm_object(size) -> (key, SharedMemory), a POSIX shared-memory object as clients make
    them (key '/shmtest-<random>'); each is closed and unlinked after the test."""
    import uuid
    from multiprocessing import shared_memory

    made: list[shared_memory.SharedMemory] = []

    def make(size: int) -> tuple[str, shared_memory.SharedMemory]:
        key = f"/shmtest-{uuid.uuid4().hex[:12]}"
        made.append(shared_memory.SharedMemory(key, create=True, size=size))
        return key, made[-1]

    yield make
    for memory in made:
        memory.close()
        try:
            memory.unlink()
        except FileNotFoundError:
            pass


@pytest.fixture
def regions():
    """Factory: regions(size) -> (key, handle), a POSIX shared-memory region as tritonclient creates it
    (under a unique key); destroyed after the test."""
    import uuid

    import tritonclient.utils.shared_memory as shm

    made = []

    def make(size: int):
        key = f"/apptest-{uuid.uuid4().hex[:12]}"
        made.append(shm.create_shared_memory_region(key.strip("/"), key, size, create_only=True))
        return key, made[-1]

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.fixture
def sleepy_repository(tmp_path) -> Path:
    """A repository with one Python model, ``sleepy``, that sleeps as long as its input says."""
    from tests.models import copy_model

    copy_model(tmp_path / "repo", "simple/sleepy")
    return tmp_path / "repo"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA with the server's and a client's certificates (tests.tls_util.Pki), shared by a
    test module's TLS daemons and clients."""
    from tests.tls_util import Pki

    return Pki(tmp_path_factory.mktemp("pki"))
