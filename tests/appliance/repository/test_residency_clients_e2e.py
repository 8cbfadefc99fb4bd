"""Residency through Triton's own clients, over both transports: index rows with the appliance's keys
read by tritonclient.http, the gRPC index's reason, metadata of a model not loaded refused with Triton's
status and saying that a request loads it, and a gRPC request's ``timeout`` parameter accepted."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.examples import mlp_model
from tests.builders import save

NOT_LOADED = "not loaded: loads on its first request (load_on_demand)"


@pytest.fixture(scope="module")
def daemon(module_in_process, tmp_path_factory):
    repo = tmp_path_factory.mktemp("on-demand") / "repo"
    for name in ("first", "second"):
        save(mlp_model(), repo / name / "1" / "model.onnx")
    return module_in_process(repo, load_on_demand=True, model_memory_budget_mib=256)


def _input(module):
    tensor = module.InferInput("input", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.full((1, 784), 0.5, dtype=np.float32))
    return tensor


def test_http_client_reads_the_index_and_metadata_of_a_model_not_loaded(daemon):
    with httpclient.InferenceServerClient(daemon.url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata("first")
        assert refused.value.status() == "404"  # Triton's, for a model not loaded (oracle/test_differential.py)
        assert "Request for unknown model: 'first' has no available versions" in refused.value.message()
        assert NOT_LOADED in refused.value.message()
        client.infer("first", [_input(httpclient)])
        rows = {row["name"]: row for row in client.get_model_repository_index()}
        assert client.get_model_metadata("first")["name"] == "first"
    assert rows["first"]["state"] == "READY" and rows["first"]["load_cause"] == "demand"
    assert rows["first"]["memory_bytes"] > 0
    assert rows["second"]["state"] == "UNAVAILABLE" and rows["second"]["reason"] == NOT_LOADED


def test_grpc_client_reads_the_reason_and_its_timeout_is_taken(daemon):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata("second")
        assert NOT_LOADED in refused.value.message()
        rows = {row.name: row for row in client.get_model_repository_index().models}
        assert rows["second"].reason == NOT_LOADED
        # Its own timeout (µs) bounds the wait for the load; ample here, so it is served.
        answer = client.infer("second", [_input(grpcclient)], timeout=60_000_000)
        assert answer.as_numpy(client.get_model_metadata("second").outputs[0].name).shape[0] == 1
