"""The stop over gRPC: calls in progress finish (or are cut at the deadline), new calls get UNAVAILABLE,
an open stream answers what it read and then ends UNAVAILABLE."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.http_util import call
from tests.processes import child_pids
from tests.waiting import wait_until

SHUTDOWN_TIMEOUT = 3.0
EXIT_TIMEOUT = 0.5  # then a model process still stuck in execute() is killed (exit_timeout)
# The deadline of a stop whose calls in progress take about 2.5 s (1 s, then 1.5 s, on one instance): 5x that,
# so a stop that waited for the deadline instead fails, and a busy box does not.
PATIENT_SHUTDOWN_TIMEOUT = 15.0


def _inputs_sleeping(seconds: float) -> list[triton.InferInput]:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([seconds, 0.0], np.float32))
    return [tensor]


def _held(daemon, *seconds: float) -> bool:
    """Whether the daemon holds a request for each of ``seconds``: running in the model (its "sleeping" line
    in the daemon's log) or queued for the model's one instance (the pending-requests gauge)."""
    log = daemon.log()
    running = sum(f"sleepy: sleeping {s:g} s" in log for s in seconds)
    _, _, metrics = call(daemon.port, "GET", "/metrics")
    queued = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
                 if line.startswith('nv_inference_pending_request_count{model="sleepy"'))
    return running + queued == len(seconds)


def _start(start_daemon, sleepy_repository, shutdown_timeout: float = SHUTDOWN_TIMEOUT):
    return start_daemon(sleepy_repository, env={"APPLIANCE_SHUTDOWN_TIMEOUT": str(shutdown_timeout),
                                                "APPLIANCE_EXIT_TIMEOUT": str(EXIT_TIMEOUT)})


def test_calls_in_progress_finish_and_new_calls_are_turned_away(start_daemon, sleepy_repository):
    daemon = _start(start_daemon, sleepy_repository, PATIENT_SHUTDOWN_TIMEOUT)
    outcome: dict[str, object] = {}
    with triton.InferenceServerClient(daemon.grpc_url) as client, \
            triton.InferenceServerClient(daemon.grpc_url) as streaming, \
            triton.InferenceServerClient(daemon.grpc_url) as late:
        assert late.is_server_live()  # connected before the stop
        answers: queue.Queue = queue.Queue()
        streaming.start_stream(callback=lambda result, error: answers.put((result, error)))
        streaming.async_stream_infer("sleepy", _inputs_sleeping(1.0), request_id="in-stream")

        def in_flight() -> None:
            try:
                outcome["unary"] = client.infer("sleepy", _inputs_sleeping(1.5)).as_numpy("y").tolist()
            except InferenceServerException as exc:
                outcome["unary"] = exc

        thread = threading.Thread(target=in_flight)
        thread.start()
        wait_until(lambda: _held(daemon, 1.0, 1.5), timeout=30, what="both requests in the daemon")
        started = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping: finishing in-flight requests" in daemon.log(), timeout=10,
                   what="the stop to begin")

        def turned_away() -> str | None:
            try:
                late.is_server_ready()  # the front end may still be a moment from closing its door
                return None
            except InferenceServerException as exc:
                return exc.status()

        outcome["late"] = wait_until(turned_away, timeout=5, what="a new call to be turned away")
        thread.join(20)
        first = answers.get(timeout=20)
        ending = answers.get(timeout=20)
        streaming.stop_stream()
        assert daemon.process.wait(20) == 0
    took = time.monotonic() - started
    assert outcome["unary"] == [1.5, 0.0]  # finished after the stop began
    assert outcome["late"] == "StatusCode.UNAVAILABLE"
    assert first[1] is None and first[0].get_response().id == "in-stream"
    assert ending[0] is None and "UNAVAILABLE" in str(ending[1].status())  # then the stream is closed
    assert took < PATIENT_SHUTDOWN_TIMEOUT  # nothing waited for the deadline


def test_a_call_still_running_at_the_deadline_is_cut(start_daemon, sleepy_repository):
    daemon = _start(start_daemon, sleepy_repository)
    children = child_pids(daemon.process.pid)
    outcome: list[object] = []
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        def stuck() -> None:
            try:
                outcome.append(client.infer("sleepy", _inputs_sleeping(30.0), client_timeout=40))
            except InferenceServerException as exc:
                outcome.append(exc.status())

        thread = threading.Thread(target=stuck)
        thread.start()
        try:
            wait_until(lambda: "sleepy: sleeping 30 s" in daemon.log(), timeout=30,
                       what="the request to run in the model")
            started = time.monotonic()
            daemon.process.send_signal(signal.SIGTERM)
            assert daemon.process.wait(SHUTDOWN_TIMEOUT + 15) == 0
            took = time.monotonic() - started
            thread.join(10)
        finally:
            for pid in children:  # the model's process, still sleeping: ours to end
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    # past the deadline: the cancel's grace, exit_timeout, the exit (about 1 s; 5x that for a busy box)
    assert SHUTDOWN_TIMEOUT - 0.2 <= took <= SHUTDOWN_TIMEOUT + 5.0, took
    assert outcome and outcome[0] in ("StatusCode.CANCELLED", "StatusCode.UNAVAILABLE"), outcome
    assert "1 gRPC request(s) still running at the shutdown deadline: cancelled" in daemon.log(), daemon.log()[-3000:]
