"""The daemon's stop keeps to one deadline: shutdown_timeout and a small margin, even with a request stuck
in a model that runs far longer."""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.http_util import call
from tests.processes import child_pids
from tests.waiting import wait_until

SHUTDOWN_TIMEOUT = 2.0
EXIT_TIMEOUT = 0.5  # then a model process still stuck in execute() is killed (exit_timeout)
# Past the deadline: the models' close grace, the cancel, the interpreter's exit (about 1 s; 5x that for a
# busy box, still far short of the 30 s request a stop that waited for it would take).
MARGIN = 5.0
# The deadline of a stop that has only a 1 s request to wait for: 5x what that takes, so a stop that waited
# for the deadline instead fails, and a busy box does not.
PATIENT_SHUTDOWN_TIMEOUT = 10.0

def _sleep_request(seconds: float) -> dict:
    return {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [seconds, 0.0]}]}


def test_stop_keeps_to_the_shutdown_timeout_with_a_request_stuck_in_a_model(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
                                                  "APPLIANCE_EXIT_TIMEOUT": str(EXIT_TIMEOUT)})
    assert call(daemon.port, "POST", "/v2/models/sleepy/infer", _sleep_request(0.0))[0] == 200
    children = child_pids(daemon.process.pid)  # the model's process, which the stop may leave running
    outcome: list[object] = []

    def stuck() -> None:
        try:
            outcome.append(call(daemon.port, "POST", "/v2/models/sleepy/infer", _sleep_request(30.0), timeout=40)[0])
        except OSError as exc:
            outcome.append(exc)

    client = threading.Thread(target=stuck)
    client.start()
    try:
        wait_until(lambda: "sleepy: sleeping 30 s" in daemon.log(), timeout=30, what="the request to run in the model")
        started = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(SHUTDOWN_TIMEOUT + 15) == 0
        took = time.monotonic() - started
        assert SHUTDOWN_TIMEOUT - 0.2 <= took <= SHUTDOWN_TIMEOUT + MARGIN, took  # waited, but no longer
        client.join(10)
        assert outcome and not isinstance(outcome[0], int)  # the stuck request was cut off, not answered late
        log = daemon.log()
        assert "still running at the shutdown deadline" in log and "stopped" in log
    finally:
        for pid in children:  # a model process still sleeping: ours to end
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_requests_that_finish_before_the_deadline_are_answered(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_SHUTDOWN_TIMEOUT": str(PATIENT_SHUTDOWN_TIMEOUT),
                                                  "APPLIANCE_EXIT_TIMEOUT": str(EXIT_TIMEOUT)})
    statuses: list[int] = []
    client = threading.Thread(target=lambda: statuses.append(
        call(daemon.port, "POST", "/v2/models/sleepy/infer", _sleep_request(1.0), timeout=20)[0]))
    client.start()
    wait_until(lambda: "sleepy: sleeping 1 s" in daemon.log(), timeout=30, what="the request to run in the model")
    started = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(PATIENT_SHUTDOWN_TIMEOUT + 15) == 0
    client.join(10)
    assert statuses == [200]
    assert time.monotonic() - started < PATIENT_SHUTDOWN_TIMEOUT  # a stop waits for requests, not the deadline
