"""Model processes that misbehave: a hung execute() or initialize() at stop (the daemon kills them after
exit_timeout and exits), a daemon killed with SIGKILL (no model process outlives it; its arenas are
removed at the next start), a process that dies while it initializes (the load says so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from appliance.backends.python.wire.arena import ARENA_PREFIX
from tests.models import copy_model
from tests.processes import child_pids, running
from tests.waiting import wait_until

# Models of tests/models/backends: hangs_in_execute and hangs_in_initialize write "hanging" in their model
# directory once they hang, for the tests to wait on; dies_in_initialize exits with code 7; echo_xy answers
# y = x; kills_its_sibling (two instances) has its second instance's initialize() kill the first one's
# process (already initialized), as an OOM killer or an operator might while a model loads, pids.txt
# listing instance 0's processes.

EXIT_TIMEOUT = 2.0
SHUTDOWN_TIMEOUT = 1.0


def _repository(root: Path, **models: str) -> Path:
    """``root`` serving each ``name=source`` (a directory of tests/models/backends)."""
    for name, source in models.items():
        copy_model(root, f"backends/{source}", name)
    return root


def _stubs(daemon_pid: int) -> list[int]:
    return [pid for pid in child_pids(daemon_pid) if b"appliance.backends.python.model_process.stub" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The processes of ``pids`` still alive after waiting up to ``timeout`` seconds for all to go."""
    try:
        wait_until(lambda: not any(running(pid) for pid in pids), timeout=timeout, interval=0.1)
    except AssertionError:
        pass  # the caller asserts on those left
    return [pid for pid in pids if running(pid)]


def _call(url: str, model: str, name: str = "x", elements: int = 2) -> None:
    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        x = httpclient.InferInput(name, [elements], "FP32")
        x.set_data_from_numpy(np.ones(elements, np.float32))
        try:
            client.infer(model, [x])
        except Exception:  # noqa: BLE001 - the daemon stops under it
            pass


def test_a_hung_execute_does_not_stop_the_daemon_from_exiting(start_daemon, tmp_path):
    repo = _repository(tmp_path / "repo", hangs="hangs_in_execute")
    daemon = start_daemon(repo, "--exit-timeout-secs", str(EXIT_TIMEOUT),
                          env={"APPLIANCE_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT)})
    stubs = _stubs(daemon.process.pid)
    assert len(stubs) == 1
    caller = threading.Thread(target=_call, args=(daemon.url, "hangs"), daemon=True)
    caller.start()
    wait_until((repo / "hangs" / "hanging").exists, timeout=30, what="the request in execute()")
    start = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    daemon.process.wait(SHUTDOWN_TIMEOUT + EXIT_TIMEOUT + 20)
    took = time.monotonic() - start
    assert took < 5 * (SHUTDOWN_TIMEOUT + EXIT_TIMEOUT)  # about their sum; 5x for a busy box, yet not a hang
    assert _wait_gone(stubs, 5) == []
    assert "did not finish within exit_timeout" in daemon.log()


def test_a_hung_initialize_does_not_stop_the_daemon_from_exiting(start_daemon, tmp_path):
    repo = _repository(tmp_path / "repo", stuck="hangs_in_initialize")
    daemon = start_daemon(repo, "--exit-timeout-secs", str(EXIT_TIMEOUT), wait_loaded=False,
                          env={"APPLIANCE_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT)})
    stubs = wait_until(lambda: _stubs(daemon.process.pid), timeout=30, interval=0.1, what="the model process")
    wait_until((repo / "stuck" / "hanging").exists, timeout=30, what="initialize() hanging")
    start = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    daemon.process.wait(SHUTDOWN_TIMEOUT + EXIT_TIMEOUT + 20)
    assert time.monotonic() - start < 5 * (SHUTDOWN_TIMEOUT + EXIT_TIMEOUT)
    assert _wait_gone(stubs, 5) == []


def test_no_model_process_outlives_a_killed_daemon_and_its_arenas_go_at_the_next_start(start_daemon, tmp_path):
    repo = _repository(tmp_path / "repo", echo="arena_echo")
    daemon = start_daemon(repo)
    _call(daemon.url, "echo", "IN", 8192)  # 32 KiB, past what travels inline: arenas exist on both sides now
    stubs = _stubs(daemon.process.pid)
    owners = {daemon.process.pid, *stubs}
    arenas = [name for name in os.listdir("/dev/shm") if name.startswith(ARENA_PREFIX)
              and int(name.removeprefix(ARENA_PREFIX).split("-", 1)[0]) in owners]
    assert arenas
    daemon.process.kill()
    daemon.process.wait(10)
    assert _wait_gone(stubs, 10) == []
    # A SIGKILL leaves them behind (unit-tested: tests/appliance/backends/test_arena.py), until a daemon
    # starts: this test's next one, or one another test starts meanwhile (the same sweep), so which of the
    # two removes them is not asserted here.
    again = start_daemon(repo)
    assert [name for name in arenas if os.path.exists(f"/dev/shm/{name}")] == []  # ... the next start removes them
    again.stop()


def test_a_process_that_dies_during_initialize_fails_the_load_saying_so(start_daemon, tmp_path):
    repo = _repository(tmp_path / "repo", dies="dies_in_initialize", echo="echo_xy")
    daemon = start_daemon(repo, "--no-strict-readiness")
    with httpclient.InferenceServerClient(daemon.url) as client:
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["echo"]["state"] == "READY"
    assert index["dies"]["state"] == "UNAVAILABLE"
    assert "the model process of 'dies' exited with code 7 during initialize()" in index["dies"]["reason"]
    assert "restarted" not in index["dies"]["reason"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_model_process_dies_with_its_parent_even_when_its_channel_stays_open(tmp_path):
    """The parent-death signal alone (the channel's other end kept open by a grandchild) ends the stub."""
    held, hold = os.pipe()  # the grandchild keeps the channel open until the test closes ``hold``
    script = textwrap.dedent(f"""
        import os, pickle, subprocess, sys
        from appliance.backends.python.wire.channel import Channel
        ours, theirs = Channel.pair()
        model = {str(_repository(tmp_path / 'repo', echo="echo_xy") / 'echo' / '1' / 'model.py')!r}
        stub = subprocess.Popen([sys.executable, "-m", "appliance.backends.python.model_process.stub",
                                 Channel.argument(theirs), model, str(os.getpid())], pass_fds=theirs)
        subprocess.Popen([sys.executable, "-c", "import os; os.read({held}, 1)"], pass_fds=(*ours.fds(), {held}))
        open({str(tmp_path / 'pid')!r}, "w").write(str(stub.pid))
        ours.send_bytes(pickle.dumps(("describe", {{}})))
        ours.recv_bytes()  # the stub's first message: it runs, past arming its parent-death signal
        os._exit(0)
    """)
    try:
        subprocess.run([sys.executable, "-c", script], timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, pass_fds=(held,))
        assert _wait_gone([int((tmp_path / "pid").read_text())], 10) == []
    finally:
        os.close(hold)  # the keeper reads its end of file and exits
        os.close(held)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_killed_while_its_model_loads_is_started_again_before_ready(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    copy_model(repo, "backends/kills_its_sibling", "sibling")
    daemon = start_daemon(repo)
    with httpclient.InferenceServerClient(daemon.url) as client:
        assert client.is_model_ready("sibling")
        # Before any request: instance 0 was started again during the load, and both processes live.
        assert len((repo / "sibling" / "pids.txt").read_text().split()) == 2
        assert len(_stubs(daemon.process.pid)) == 2
        x = httpclient.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1, 2], np.float32))
        for _ in range(4):  # whichever instance each lands on
            assert client.infer("sibling", [x]).as_numpy("y").tolist() == [1, 2]
