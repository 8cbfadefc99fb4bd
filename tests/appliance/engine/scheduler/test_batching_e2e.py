"""Dynamic batching through the daemon: tritonclient under concurrency, queue policies over HTTP."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from appliance.examples import mlp_model
from tests.builders import write_model
from tests.http_util import call
from tests.waiting import wait_until

BATCHED = """
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
# Waits long for company, so requests sit in the queue where the tests can observe them.
PATIENT = """
max_batch_size: 8
dynamic_batching {
  preferred_batch_size: [ 8 ]
  max_queue_delay_microseconds: 1500000
  default_queue_policy { max_queue_size: 1 allow_timeout_override: true }
}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "batched", mlp_model(seed=5), config=BATCHED)
    write_model(repo, "patient", mlp_model(seed=6), config=PATIENT)
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repo):
    return module_in_process(repo)


def _one_row_body(seed=0):
    x = np.random.default_rng(seed).random(784).astype(np.float32)
    return {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": x.tolist()}]}


def _stats(daemon, model):
    status, _, payload = call(daemon.port, "GET", f"/v2/models/{model}/stats")
    assert status == 200
    return payload["model_stats"][0]


def _metric(daemon, name: str, model: str, **labels: str) -> float:
    """The value of metric ``name`` for ``model`` (and ``labels``), from /metrics; 0 when absent."""
    _, _, text = call(daemon.port, "GET", "/metrics")
    wanted = [f'model="{model}"', *(f'{key}="{value}"' for key, value in labels.items())]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
               if line.startswith(name + "{") and all(label in line for label in wanted))


def test_64_concurrent_mixed_batches_equal_unbatched_results(daemon, repo):
    session = ort.InferenceSession(str(repo / "batched" / "1" / "model.onnx"))
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((int(rng.integers(1, 5)), 784)).astype(np.float32) for _ in range(64)]

    def send(x):
        with triton.InferenceServerClient(daemon.url) as client:
            tensor = triton.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            return client.infer("batched", [tensor]).as_numpy("probabilities")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, requests))
    for x, got in zip(requests, results):
        want = np.concatenate([session.run(None, {"input": row[None]})[0] for row in x])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = _stats(daemon, "batched")
    assert stats["inference_count"] == sum(len(x) for x in requests)
    assert stats["execution_count"] < 64  # requests were combined
    assert stats["inference_stats"]["success"]["count"] == 64
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 4  # bigger than any single request
    with triton.InferenceServerClient(daemon.url) as client:
        again = client.get_inference_statistics("batched")["model_stats"][0]
        assert again["execution_count"] == stats["execution_count"]


def test_full_queue_gets_503_with_retry_after(daemon):
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, daemon.port, "POST", "/v2/models/patient/infer", _one_row_body())
        # the first request now waits in the queue for company
        wait_until(lambda: _metric(daemon, "nv_inference_pending_request_count", "patient") == 1,
                   what="the first request queued")
        status, headers, payload = call(daemon.port, "POST", "/v2/models/patient/infer", _one_row_body(1))
        assert status == 503
        assert "max_queue_size 1" in payload["error"]
        assert int(headers["Retry-After"]) >= 1
        assert first.result()[0] == 200


def test_request_timeout_parameter_rejects_from_the_queue(daemon):
    body = {**_one_row_body(), "parameters": {"timeout": 100_000}}
    started = time.monotonic()
    status, _, payload = call(daemon.port, "POST", "/v2/models/patient/infer", body)
    assert status == 503 and "timed out after 100.0 ms" in payload["error"]
    assert time.monotonic() - started < 1.4  # rejected at its timeout, not after the batching delay


def test_client_that_disconnects_while_queued_is_never_executed(daemon):
    before = _stats(daemon, "patient")["execution_count"]
    cancelled = _metric(daemon, "nv_inference_request_failure", "patient", reason="CANCELED")
    payload = json.dumps(_one_row_body()).encode()
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        # (a Host the daemon takes as its own: with any other, it answers 403 before the request is queued)
        sock.sendall(f"POST /v2/models/patient/infer HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n".encode()
                     + b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_until(lambda: _metric(daemon, "nv_inference_pending_request_count", "patient") == 1,
                   what="the request queued")
    # The disconnect cancels it and takes it out of the queue (long before the 1.5 s batching delay): it
    # can never execute now.
    wait_until(lambda: _metric(daemon, "nv_inference_request_failure", "patient", reason="CANCELED") == cancelled + 1
               and _metric(daemon, "nv_inference_pending_request_count", "patient") == 0,
               what="the queued request cancelled and dropped from the queue")
    assert _stats(daemon, "patient")["execution_count"] == before
    status, _, _ = call(daemon.port, "POST", "/v2/models/patient/infer", _one_row_body())
    assert status == 200


def test_bad_priority_is_a_400(daemon):
    body = {**_one_row_body(), "parameters": {"priority": "high"}}
    status, _, payload = call(daemon.port, "POST", "/v2/models/batched/infer", body)
    assert status == 400 and "invalid value type for 'priority' parameter" in payload["error"]


def test_statistics_extension_shapes(daemon):
    status, _, payload = call(daemon.port, "GET", "/v2/models/stats")
    assert status == 200 and {m["name"] for m in payload["model_stats"]} == {"batched", "patient"}
    status, _, payload = call(daemon.port, "GET", "/v2/models/batched/versions/1/stats")
    assert status == 200 and payload["model_stats"][0]["version"] == "1"
    assert set(payload["model_stats"][0]["inference_stats"]) >= {
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output"}
