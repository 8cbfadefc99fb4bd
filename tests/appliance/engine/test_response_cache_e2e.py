"""The response cache end to end, with Triton's clients against a daemon started with --cache-config: the
statistics over HTTP and gRPC, /metrics, and each request's own encoding of a cached answer (outputs asked
for, JSON or binary, classification, a shared-memory region)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.builders import write_cache_repository
from tests.http_util import call

X = np.array([[1, 2, 3, 4, 5, 6]], np.float32)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_cache_repository(tmp_path_factory.mktemp("cache") / "repo")


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, cache_config=("local,size=1048576",))


def _infer(client, model: str, x: np.ndarray = X, outputs=None):
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], outputs=outputs)


def _cache_counts(statistics: dict) -> tuple[int, int]:
    inference = statistics["model_stats"][0]["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"]


def test_hits_and_misses_in_tritons_statistics_over_http_and_grpc(daemon):
    client = httpclient.InferenceServerClient(daemon.url)
    x = X + 10
    first = _infer(client, "cached", x)
    again = _infer(client, "cached", x)
    np.testing.assert_array_equal(again.as_numpy("square"), first.as_numpy("square"))
    statistics = client.get_inference_statistics("cached")
    hits, misses = _cache_counts(statistics)
    assert hits >= 1 and misses >= 1
    assert statistics["model_stats"][0]["inference_count"] == misses  # a hit runs nothing
    over_grpc = grpcclient.InferenceServerClient(daemon.grpc_url).get_inference_statistics("cached")
    inference = over_grpc.model_stats[0].inference_stats
    assert (inference.cache_hit.count, inference.cache_miss.count) == (hits, misses)
    assert inference.cache_hit.ns > 0
    _infer(client, "uncached", x)
    _infer(client, "uncached", x)
    assert _cache_counts(client.get_inference_statistics("uncached")) == (0, 0)


def test_a_grpc_request_hits_what_an_http_request_left(daemon):
    x = X + 50
    square = [httpclient.InferRequestedOutput("square")]
    _infer(httpclient.InferenceServerClient(daemon.url), "cached", x, outputs=square)  # over HTTP, then gRPC
    client = grpcclient.InferenceServerClient(daemon.grpc_url)
    hits = client.get_inference_statistics("cached").model_stats[0].inference_stats.cache_hit.count
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("cached", [tensor], outputs=[grpcclient.InferRequestedOutput("square")])
    np.testing.assert_array_equal(result.as_numpy("square"), x * x)
    assert result.as_numpy("double") is None
    assert client.get_inference_statistics("cached").model_stats[0].inference_stats.cache_hit.count == hits + 1


def test_each_request_gets_its_own_encoding_of_a_cached_answer(daemon):
    client = httpclient.InferenceServerClient(daemon.url)
    x = X + 20
    _infer(client, "cached", x)  # cached with every output
    hits = _cache_counts(client.get_inference_statistics("cached"))[0]
    as_json = _infer(client, "cached", x, outputs=[httpclient.InferRequestedOutput("double", binary_data=False),
                                                   httpclient.InferRequestedOutput("square", binary_data=True)])
    assert [o["name"] for o in as_json.get_response()["outputs"]] == ["double", "square"]
    assert "data" in as_json.get_output("double") and "data" not in as_json.get_output("square")
    np.testing.assert_array_equal(as_json.as_numpy("double"), 2 * x)
    assert _cache_counts(client.get_inference_statistics("cached"))[0] == hits + 1
    only_square = _infer(client, "cached", x, outputs=[httpclient.InferRequestedOutput("square")])
    assert [o["name"] for o in only_square.get_response()["outputs"]] == ["square"]  # Triton sends both here
    top = _infer(client, "cached", x, outputs=[httpclient.InferRequestedOutput("square", class_count=2)])
    top_again = _infer(client, "cached", x, outputs=[httpclient.InferRequestedOutput("square", class_count=2)])
    assert list(top.as_numpy("square")[0]) == list(top_again.as_numpy("square")[0]) == [b"676.000000:5",
                                                                                        b"625.000000:4"]


def test_a_cached_answer_is_written_into_the_requests_shared_memory(daemon, regions):
    client = httpclient.InferenceServerClient(daemon.url)
    client.unregister_system_shared_memory()
    x = X + 30
    _infer(client, "cached", x)
    key, handle = regions(2 * X.nbytes)
    client.register_system_shared_memory("out", key, 2 * X.nbytes)
    try:
        outputs = [httpclient.InferRequestedOutput("double"), httpclient.InferRequestedOutput("square")]
        outputs[0].set_shared_memory("out", X.nbytes)
        outputs[1].set_shared_memory("out", X.nbytes, offset=X.nbytes)
        hits = _cache_counts(client.get_inference_statistics("cached"))[0]
        result = _infer(client, "cached", x, outputs=outputs)
        assert _cache_counts(client.get_inference_statistics("cached"))[0] == hits + 1
        assert "data" not in result.get_output("square")  # written into the region
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 6]), 2 * x)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 6], offset=X.nbytes), x * x)
    finally:
        client.unregister_system_shared_memory()


def test_metrics_show_tritons_cache_counters_and_the_caches_own(daemon):
    client = httpclient.InferenceServerClient(daemon.url)
    _infer(client, "cached", X + 40)
    _infer(client, "cached", X + 40)
    status, _, body = call(daemon.port, "GET", "/metrics")
    text = body.decode()
    assert status == 200
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line and not line.startswith("#")}
    assert lines['nv_cache_num_hits_per_model{model="cached",version="1"}'] >= 1
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"}' in lines
    assert not any('model="uncached"' in key for key in lines if key.startswith("nv_cache"))
    assert 0 < lines["nv_cache_util"] <= 1 and lines["nv_cache_num_entries"] >= 1
    assert lines["appliance_response_cache_size_bytes"] == 1048576


def test_config_shows_response_cache_as_triton(daemon):
    client = httpclient.InferenceServerClient(daemon.url)
    assert client.get_model_config("cached")["response_cache"] == {"enable": True}
    assert "response_cache" not in client.get_model_config("uncached")
