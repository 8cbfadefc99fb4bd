"""gRPC and HTTP requests share one scheduler: they batch together, and both protocols count them."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from appliance.examples import mlp_model
from tests.builders import write_model

# Waits (up to 3 s) for a full batch of 16: 8 requests from each protocol fill it.
TOGETHER = """
max_batch_size: 16
dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 3000000 }
"""


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "together", mlp_model(seed=11), config=TOGETHER)
    return repo


def test_http_and_grpc_requests_batch_together(serve_in_process, repo):
    daemon = serve_in_process(repo)
    rows = np.random.default_rng(0).random((16, 784)).astype(np.float32)
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def send(index: int) -> None:  # odd rows over HTTP, even ones over gRPC
        module, url = (triton_http, daemon.url) if index % 2 else (triton_grpc, daemon.grpc_url)
        try:
            with module.InferenceServerClient(url) as client:
                tensor = module.InferInput("input", [1, 784], "FP32")
                tensor.set_data_from_numpy(rows[index : index + 1])
                results[index] = client.infer("together", [tensor]).as_numpy("probabilities")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    session = ort.InferenceSession(str(repo / "together" / "1" / "model.onnx"))
    expected = session.run(None, {"input": rows})[0]
    np.testing.assert_allclose(np.concatenate([results[i] for i in range(16)]), expected, rtol=1e-5, atol=1e-6)

    with triton_grpc.InferenceServerClient(daemon.grpc_url) as client:
        stats = client.get_inference_statistics("together").model_stats[0]
    assert stats.inference_count == 16
    assert stats.execution_count < stats.inference_count
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(16, 1)]  # one batch, both protocols
    assert stats.inference_stats.success.count == 16
    with triton_http.InferenceServerClient(daemon.url) as client:
        over_rest = client.get_inference_statistics("together")["model_stats"][0]
    assert (over_rest["inference_count"], over_rest["execution_count"]) == (16, stats.execution_count)
