"""Streamed BLS calls (``exec(decoupled=True)``) through a real daemon, as Triton's L0_backend_python
decoupled and async_execute suites use them: ``ResponseIterator.cancel()`` asks the called model to
stop and still delivers what it sends (a model that ignores the cancellation streams on), and an async
execute() awaiting streamed calls serves its requests concurrently."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import copy_model

# Models of tests/models/backends: until_cancelled streams IN every 50 ms, up to COUNT responses, and
# unless IGNORE is set ends with a CANCELLED error once cancelled (Triton's response_sender_until_cancelled);
# bls_cancel sums its streamed responses and cancels the stream once the sum reaches MAX_SUM (Triton's
# decoupled_bls_cancel); sleeper, an async execute() that sleeps WAIT seconds and answers once (Triton's
# async_execute_decouple), and sleeper_bls, which reaches it through an awaited streamed BLS call per request
# (Triton's async_execute_decouple_bls).

WAIT = 2.0
"""Seconds each sleeper request takes: eight of them one after the other would take 16."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("bls-streams")
    for name in ("until_cancelled", "bls_cancel", "sleeper", "sleeper_bls"):
        copy_model(repo, f"backends/{name}")
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _bls_cancel(client, max_sum: int, ignore: bool) -> tuple[int, bool, int]:
    tensors = [httpclient.InferInput("MAX_SUM", [1], "INT32"), httpclient.InferInput("IGNORE", [1], "BOOL")]
    tensors[0].set_data_from_numpy(np.array([max_sum], np.int32))
    tensors[1].set_data_from_numpy(np.array([ignore], np.bool_))
    result = client.infer("bls_cancel", tensors)
    return (int(result.as_numpy("SUM")[0]), bool(result.as_numpy("IS_CANCELLED")[0]),
            int(result.as_numpy("READ")[0]))


def test_a_cancelled_bls_stream_ends_with_the_called_models_cancelled_error(client):
    total, cancelled, read = _bls_cancel(client, max_sum=5, ignore=False)
    assert cancelled  # the called model saw is_cancelled() and said so in its last response
    assert 5 <= total < 20 and read == total  # it stopped early; nothing was cut before the error came


def test_a_bls_stream_cancel_that_the_called_model_ignores_delivers_every_response(client):
    total, cancelled, read = _bls_cancel(client, max_sum=5, ignore=True)
    assert not cancelled and total == read == 20  # Triton keeps delivering: the cancel is a request


def test_async_execute_serves_streamed_bls_requests_concurrently(daemon):
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
        try:
            tensor = grpcclient.InferInput("WAIT", [1], "FP32")
            tensor.set_data_from_numpy(np.array([WAIT], np.float32))
            started = time.monotonic()
            for index in range(8):
                client.async_stream_infer("sleeper_bls", [tensor], request_id=str(index))
            got = [answers.get(timeout=30) for _ in range(8)]
        finally:
            client.stop_stream()
    assert all(error is None and result.as_numpy("OUT").tolist() == [WAIT] for _, result, error in got)
    last = max(at for at, _, _ in got) - started
    # together about WAIT; 5x that leaves a busy box its time and still fails the 8 * WAIT of one at a time
    assert last < 5 * WAIT, f"eight {WAIT} s requests took {last:.1f} s: they ran one after another"
