"""A hostile model (tests/models/hostile) in its own process, every way execute() can misbehave: it raises,
returns garbage (None, a list of None, the wrong length, no response), blocks, exits, closes or scribbles on
stdout, forks a child that lingers, exhausts its memory. Every request is answered (Triton's error, HTTP
500 / gRPC INTERNAL, where Triton gives one) or ends at its deadline, failures are logged once, and the
model (or the process started in its place) serves the next request."""

from __future__ import annotations

import os
import queue
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.appliance.backends.python.hostile_models import WRONG_RETURNS, failed, write_hostile
from tests.processes import running
from tests.waiting import wait_until

DEADLINE = 1.0
"""request_deadline: a stream whose model blocks ends DEADLINE_EXCEEDED after it."""
ANSWERED = 30.0
"""Seconds any answer may take on a loaded box (an exit and a restart included)."""

MODELS = {"hostile": "config", "hostile_batched": "batched", "hostile_decoupled": "decoupled", "blocks": "config",
          "blocks_decoupled": "decoupled", "closes_stdout": "config", "forks": "config", "exhausts_memory": "config"}
"""Each model serves the hostile model.py; those whose misbehaviour outlasts a request have their own."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "repo"
    for name, config in MODELS.items():
        write_hostile(root, name, config)
    return root


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, "--request-deadline", str(DEADLINE), "--exit-timeout-secs", "1",
                         "--metrics-port", "0", env={"APPLIANCE_SHUTDOWN_TIMEOUT": "1"})


def _inputs(mode: str, value: float, batched: bool = False, client=httpclient) -> list:
    shape = [1, 1] if batched else [1]
    tensors = [client.InferInput("MODE", shape, "BYTES"), client.InferInput("X", [1, 2] if batched else [2], "FP32")]
    tensors[0].set_data_from_numpy(np.array([mode.encode()], dtype=object).reshape(shape))
    tensors[1].set_data_from_numpy(np.full([1, 2] if batched else [2], value, np.float32))
    return tensors


def _infer(daemon, model: str, mode: str, value: float = 1.0, timeout: float = ANSWERED):
    with httpclient.InferenceServerClient(daemon.url, network_timeout=timeout) as client:
        return client.infer(model, _inputs(mode, value, model.endswith("batched")))


def _serves(daemon, model: str, value: float = 5.0) -> None:
    """The model answers a good request (its process started again, if it had to be)."""
    result = _infer(daemon, model, "echo", value)
    assert result.as_numpy("Y").reshape(-1).tolist() == [value, value]


def _log(daemon) -> str:
    """The daemon's log (the model processes' stdout too, garbage included)."""
    return daemon.log_path.read_bytes().decode(errors="replace")


@pytest.mark.parametrize("mode", sorted(WRONG_RETURNS))
def test_a_wrong_return_answers_with_tritons_error_and_the_model_serves_on(daemon, mode):
    with pytest.raises(InferenceServerException) as info:
        _infer(daemon, "hostile", mode)
    assert info.value.status() == "500"
    assert re.search(failed("hostile_0", mode), info.value.message()), info.value.message()
    _serves(daemon, "hostile")


@pytest.mark.parametrize("mode", ["none", "list_of_none", "short", "list_of_string", "raise"])
def test_every_request_of_a_batch_gets_the_error(daemon, mode):
    with httpclient.InferenceServerClient(daemon.url, network_timeout=ANSWERED, concurrency=4) as client:
        pending = [client.async_infer("hostile_batched", _inputs(mode, 1.0, batched=True)) for _ in range(4)]
        for request in pending:
            with pytest.raises(InferenceServerException) as info:
                request.get_result()
            assert info.value.status() == "500"
            assert re.search(failed("hostile_batched_0", mode), info.value.message()), info.value.message()
    _serves(daemon, "hostile_batched")


@pytest.mark.parametrize("mode,text,once", [
    ("none", "Expected a list in the execute return, found type '<class 'NoneType'>'",
     "later requests of this instance let go of unanswered get the same error, unlogged"),
    ("raise", "RuntimeError: the hostile model raised",
     "logged once per model process: later failures of execute() only fail their requests"),
])
def test_a_failure_is_logged_once_not_once_per_request(daemon, mode, text, once):
    before = _log(daemon).count(text)
    for _ in range(4):
        with pytest.raises(InferenceServerException, match=re.escape(text)):
            _infer(daemon, "hostile", mode)
    # The process logs its first failure of the kind (in this test, or in an earlier one), and no other.
    assert _log(daemon).count(text) - before <= 1
    assert once in _log(daemon)


def test_a_wrong_return_is_internal_over_grpc(daemon):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client, pytest.raises(InferenceServerException) as info:
        client.infer("hostile", _inputs("none", 1.0, client=grpcclient), client_timeout=ANSWERED)
    assert info.value.status() == "StatusCode.INTERNAL"
    assert re.search(failed("hostile_0", "none"), info.value.message())


def _stream(daemon, model: str, mode: str, value: float = 1.0) -> tuple[object, object]:
    """(result, error) of one request on a gRPC stream."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(model, _inputs(mode, value, client=grpcclient))
            return answers.get(timeout=ANSWERED)
        finally:
            client.stop_stream(cancel_requests=True)


@pytest.mark.parametrize("mode,message", [
    ("returns_responses", "Failed to process the request(s) for model 'hostile_decoupled_0', message: Python model "
                          "'hostile_decoupled_0' is using the decoupled mode and the execute function must return "
                          "None."),
    ("raise", "RuntimeError: the hostile model raised"),
])
def test_a_decoupled_model_that_misbehaves_answers_with_tritons_error(daemon, mode, message):
    result, error = _stream(daemon, "hostile_decoupled", mode)
    assert result is None and message in error.message()
    result, error = _stream(daemon, "hostile_decoupled", "echo", 4.0)
    assert error is None and result.as_numpy("Y").tolist() == [4.0, 4.0]


def test_a_blocked_stream_ends_at_its_deadline_and_the_server_serves_on(daemon):
    started = time.monotonic()
    result, error = _stream(daemon, "blocks_decoupled", "block")
    assert result is None and "request_deadline" in error.message()
    assert time.monotonic() - started < 10 * DEADLINE + 5
    result, error = _stream(daemon, "hostile_decoupled", "echo", 6.0)
    assert error is None and result.as_numpy("Y").tolist() == [6.0, 6.0]


def test_a_blocked_request_times_out_at_the_clients_deadline_and_the_server_serves_on(daemon):
    started = time.monotonic()
    with pytest.raises(Exception, match="(?i)timed? ?out"):
        _infer(daemon, "blocks", "block", timeout=2.0)
    assert time.monotonic() - started < 2.0 * 5
    _serves(daemon, "hostile")


def test_an_exit_answers_and_a_new_process_serves(daemon):
    with pytest.raises(InferenceServerException, match="exited with code 3") as info:
        _infer(daemon, "hostile", "exit")
    assert info.value.status() == "500"
    _serves(daemon, "hostile")


def test_closing_stdout_fails_only_that_request(daemon):
    with pytest.raises(InferenceServerException, match=r"OSError: \[Errno 9\] Bad file descriptor") as info:
        _infer(daemon, "closes_stdout", "close_stdout")
    assert info.value.status() == "500"
    _serves(daemon, "closes_stdout")


def test_garbage_on_stdout_never_reaches_the_channel(daemon):
    # The channel is a pipe pair of its own (never fd 1): what the model writes there is the daemon's
    # stdout, its log here.
    result = _infer(daemon, "hostile", "write_fd1", 7.0)
    assert result.as_numpy("Y").tolist() == [7.0, 7.0]
    wait_until(lambda: "hostile stdout garbage" in _log(daemon), timeout=ANSWERED, what="the garbage in the log")
    _serves(daemon, "hostile")


def test_a_forked_child_that_lingers_does_not_hide_its_parents_exit(daemon, repository):
    result = _infer(daemon, "forks", "fork", 8.0)
    assert result.as_numpy("Y").tolist() == [8.0, 8.0]
    child = int((repository / "forks" / "children.txt").read_text().split()[-1])
    try:
        assert running(child)
        # The child holds no end of the channel: the parent's exit is seen, and answered, while it lingers.
        with pytest.raises(InferenceServerException, match="exited with code 3"):
            _infer(daemon, "forks", "exit")
        assert running(child)
        _serves(daemon, "forks")
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


def test_exhausting_memory_fails_that_request_and_the_model_serves_on(daemon):
    with pytest.raises(InferenceServerException, match="MemoryError") as info:
        _infer(daemon, "exhausts_memory", "exhaust_memory")
    assert info.value.status() == "500"
    _serves(daemon, "exhausts_memory")
