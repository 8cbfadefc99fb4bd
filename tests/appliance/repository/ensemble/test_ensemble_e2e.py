"""Ensembles through the daemon with Triton's own clients, over HTTP and gRPC: the image pipeline the
client repo's ensemble_image_client.py expects, metadata, statistics, errors, and the explicit-mode
lifecycle (load pulls in the composing models, unload_dependents takes them away)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests.appliance.repository.ensemble.image_pipeline import LABELS, image_pipeline_repository, write_images
from tests.appliance.repository.ensemble.repos import diamond_repository
from tests.http_util import call

ENSEMBLE = "preprocess_inception_ensemble"
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    paths = write_images(tmp_path_factory.mktemp("images"))
    return paths, np.stack([np.array([p.read_bytes()], dtype=bytes) for p in paths])


@pytest.fixture(scope="module")
def daemon(module_in_process, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    image_pipeline_repository(repo)
    diamond_repository(repo)
    return module_in_process(repo)


def _pixels(path) -> np.ndarray:
    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB").resize((16, 16))
    return np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0


def _client(daemon, protocol: str):
    """(tritonclient module, its client) for ``protocol``: http or grpc."""
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(daemon.url)
    return grpcclient, grpcclient.InferenceServerClient(daemon.grpc_url)


def test_the_ensemble_is_described_like_any_model(daemon):
    http = httpclient.InferenceServerClient(daemon.url)
    assert http.is_server_ready() and http.is_model_ready(ENSEMBLE)
    metadata = http.get_model_metadata(ENSEMBLE)
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "INPUT", "datatype": "BYTES", "shape": [-1, 1]}]
    config = http.get_model_config(ENSEMBLE)
    assert config["platform"] == "ensemble" and config["max_batch_size"] == 8
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["image_preprocess", "classifier"]
    grpc = grpcclient.InferenceServerClient(daemon.grpc_url)
    assert grpc.get_model_config(ENSEMBLE).config.platform == "ensemble"
    index = {row["name"]: row for row in http.get_model_repository_index()}
    assert index[ENSEMBLE]["state"] == "READY"
    status, _, selection = call(daemon.port, "GET", f"/v2/models/{ENSEMBLE}/selection")
    assert status == 200 and selection["status"] == "ensemble" and "composing models" in selection["reason"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_images_are_classified_through_the_pipeline_as_the_classifier_alone_would(daemon, images, protocol):
    paths, batch = images
    module, client = _client(daemon, protocol)
    pixels = np.stack([_pixels(p) for p in paths])
    direct_in = module.InferInput("image", list(pixels.shape), "FP32")
    direct_in.set_data_from_numpy(pixels)
    expected = client.infer("classifier", [direct_in]).as_numpy("logits")

    raw = module.InferInput("INPUT", list(batch.shape), "BYTES")
    raw.set_data_from_numpy(batch)
    logits = client.infer(ENSEMBLE, [raw]).as_numpy("OUTPUT")
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)

    top = client.infer(ENSEMBLE, [raw], outputs=[module.InferRequestedOutput("OUTPUT", class_count=2)])
    classes = top.as_numpy("OUTPUT")
    assert classes.shape == (3, 2)
    for row, scores in zip(classes, expected):
        value, index, label = row[0].decode().split(":")
        assert int(index) == int(np.argmax(scores)) and label == LABELS[int(index)]
        assert float(value) == pytest.approx(float(scores.max()), rel=1e-5)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_step_fails_the_request_with_the_step_message(daemon, protocol):
    module, client = _client(daemon, protocol)
    raw = module.InferInput("INPUT", [1, 1], "BYTES")
    raw.set_data_from_numpy(np.array([[b"not an image"]], dtype=bytes))
    with pytest.raises(InferenceServerException) as failed:
        client.infer(ENSEMBLE, [raw])
    message = str(failed.value)
    assert f"in ensemble '{ENSEMBLE}'," in message and "cannot decode the image" in message


def test_statistics_count_the_ensemble_and_each_composing_model(daemon, images):
    _, batch = images
    http = httpclient.InferenceServerClient(daemon.url)
    before = {m["name"]: m for m in http.get_inference_statistics()["model_stats"]}
    raw = httpclient.InferInput("INPUT", list(batch.shape), "BYTES")
    raw.set_data_from_numpy(batch)
    for _ in range(2):
        http.infer(ENSEMBLE, [raw])
    after = {m["name"]: m for m in http.get_inference_statistics()["model_stats"]}

    def grew(model: str, *path: str) -> int:
        a, b = after[model], before[model]
        for key in path:
            a, b = a[key], b[key]
        return a - b

    assert grew(ENSEMBLE, "inference_stats", "success", "count") == 2
    assert grew(ENSEMBLE, "inference_count") == 6 and grew(ENSEMBLE, "execution_count") == 2
    assert grew(ENSEMBLE, "inference_stats", "compute_infer", "ns") > 0
    for composing in ("image_preprocess", "classifier"):
        assert grew(composing, "inference_stats", "success", "count") == 2
        assert grew(composing, "inference_count") == 6


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_explicit_mode_loads_the_composing_models_and_unload_dependents_unloads_them(serve_in_process, tmp_path,
                                                                                      protocol):
    daemon = serve_in_process(diamond_repository(tmp_path / "repo"), model_control_mode="explicit")
    client = httpclient.InferenceServerClient(daemon.url) if protocol == "http" else \
        grpcclient.InferenceServerClient(daemon.grpc_url)
    assert not client.is_model_ready("double")
    client.load_model("chain")
    assert all(client.is_model_ready(m) for m in ("chain", "double", "plus_one"))
    assert not client.is_model_ready("two_outputs")
    client.load_model("diamond")
    client.unload_model("plus_one")  # a composing model goes: so do the ensembles using it
    assert not client.is_model_ready("chain") and not client.is_model_ready("diamond")
    client.load_model("chain")
    client.unload_model("chain", unload_dependents=True)
    assert not any(client.is_model_ready(m) for m in ("chain", "double", "plus_one"))
    assert client.is_server_ready()  # models unloaded on purpose are not failures
    if protocol == "http":
        status, _, body = call(daemon.port, "POST", "/v2/repository/models/chain/unload",
                               {"parameters": {"unload_dependents": "yes"}})
        assert status == 400 and "'unload_dependents' must be a boolean" in body["error"]
