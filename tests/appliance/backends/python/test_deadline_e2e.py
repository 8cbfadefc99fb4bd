"""request_deadline (off by default, as in Triton): a decoupled model that never sends its final flag, and
a model with one instance calling itself (BLS), no longer hold their requests for ever: past the deadline
the request is cancelled and its caller told DEADLINE_EXCEEDED, and the model serves on."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import copy_model
from tests.waiting import wait_until

DEADLINE = 1.0

# backends/never_final: sends one response and never its final flag; a thread notes in seen.txt when the
# request turns cancelled. backends/calls_itself: one instance; IN > 0 calls this same model with IN - 1 and
# answers what that call gave (its error text and code, if any); IN == 0 answers at once.


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deadline") / "repo"
    copy_model(root, "backends/never_final")
    copy_model(root, "backends/calls_itself")
    return root


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, request_deadline=DEADLINE)


def test_a_stream_without_a_final_flag_ends_deadline_exceeded_and_the_model_sees_it(daemon, repository):
    answers: queue.Queue = queue.Queue()
    lost = "lost"
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
        try:
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([7], np.int32))
            started = time.monotonic()
            client.async_stream_infer("never_final", [tensor], request_id=lost)
            _, first, error = answers.get(timeout=30)
            assert error is None and first.as_numpy("OUT").tolist() == [7]
            ended, _, error = answers.get(timeout=10 * DEADLINE)
        finally:
            client.stop_stream(cancel_requests=True)  # (without it, a stream that never ends waits for ever)
    assert error is not None and "request_deadline" in error.message()
    assert DEADLINE <= ended - started < 10 * DEADLINE
    seen = repository / "never_final" / "seen.txt"
    wait_until(lambda: seen.exists() and lost in seen.read_text(), timeout=30, interval=0.05,
               what="the model noting the lost request")
    assert f"{lost} True" in seen.read_text()  # the model saw request.is_cancelled()


def _calls_itself(client, value: int) -> str:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return client.infer("calls_itself", [tensor]).as_numpy("OUT")[0].decode()


def test_a_model_calling_itself_with_one_instance_gets_an_error_instead_of_holding_it(daemon):
    with httpclient.InferenceServerClient(daemon.url, network_timeout=10 * DEADLINE) as client:
        started = time.monotonic()
        code, message = _calls_itself(client, 1).split("|", 1)
        assert time.monotonic() - started < 10 * DEADLINE
        assert int(code) == 4 and "did not complete within request_deadline" in message  # UNAVAILABLE
        assert _calls_itself(client, 0) == "done"  # the instance is free again
