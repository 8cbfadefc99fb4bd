"""End to end through Triton's own client: the daemon as users start it, real onnxruntime models."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from appliance.examples import mlp_model
from tests.builders import DATATYPES, affine_model, identity_model, sample_tensor, two_output_model, write_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "identity", identity_model(DATATYPES))  # no config.pbtxt: auto-completed
    write_model(repo, "mlp", mlp_model(seed=3))
    write_model(repo, "two_outputs", two_output_model())
    for version in (1, 2, 3):
        write_model(repo, "affine", affine_model(scale=version, offset=10 * version), version=version,
                    config='version_policy: { all { } }\n')
    write_model(repo, "fixed", identity_model(["FP32"], batch=False), config=(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "IN_FP32" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]\n'
        'output [ { name: "OUT_FP32" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]\n'))
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    """Served in this process; the ``client`` fixture (tests/conftest.py) talks to it."""
    return module_in_process(repository)


def _reference(repo, model: str, feeds: dict[str, np.ndarray], version: int = 1) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / str(version) / "model.onnx"))
    feeds = {k: v.astype(str) if v.dtype == object else v for k, v in feeds.items()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def test_server_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"  # what Triton's clients check
    assert {"binary_tensor_data", "model_configuration"} <= set(metadata["extensions"])


def test_auto_completed_config_and_metadata(client):
    config = client.get_model_config("identity")
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4  # Triton's default when every tensor has a dynamic batch dim
    assert "dynamic_batching" in config
    assert config["default_model_filename"] == "model.onnx"
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["count"] == 2  # Triton's default for onnxruntime on CPU
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs["IN_FP32"]["data_type"] == "TYPE_FP32" and inputs["IN_FP32"]["dims"] == [4]
    assert inputs["IN_BYTES"]["data_type"] == "TYPE_STRING"
    metadata = client.get_model_metadata("identity")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["versions"] == ["1"]
    shapes = {i["name"]: (i["datatype"], i["shape"]) for i in metadata["inputs"]}
    assert shapes["IN_FP16"] == ("FP16", [-1, 4])
    assert client.is_model_ready("identity")


def test_explicit_config_is_respected(client):
    config = client.get_model_config("fixed")
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [4, 4]
    assert "dynamic_batching" not in config
    metadata = client.get_model_metadata("fixed")
    assert metadata["inputs"][0]["shape"] == [4, 4]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(client, repository, binary):
    inputs, feeds = [], {}
    for index, dt in enumerate(DATATYPES):
        data = sample_tensor(dt, (2, 4), seed=index)
        tensor = triton.InferInput(f"IN_{dt}", list(data.shape), dt)
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
        feeds[f"IN_{dt}"] = data
    outputs = [triton.InferRequestedOutput(f"OUT_{dt}", binary_data=binary) for dt in DATATYPES]
    result = client.infer("identity", inputs, outputs=outputs)
    expected = _reference(repository, "identity", feeds)
    for dt in DATATYPES:
        got = result.as_numpy(f"OUT_{dt}")
        want = expected[f"OUT_{dt}"]
        if dt == "BYTES":
            assert [g.decode() if isinstance(g, bytes) else g for g in got.ravel()] == list(want.ravel())
        else:
            assert got.dtype == want.dtype, dt
            np.testing.assert_array_equal(got, want)
        assert result.get_output(f"OUT_{dt}")["datatype"] == dt


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_dynamic_batch_matches_onnxruntime(client, repository, batch, binary):
    x = np.random.default_rng(batch).standard_normal((batch, 784)).astype(np.float32)
    tensor = triton.InferInput("input", [batch, 784], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("mlp", [tensor], outputs=[triton.InferRequestedOutput("probabilities", binary_data=binary)])
    expected = _reference(repository, "mlp", {"input": x})["probabilities"]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-6, atol=1e-7)


def test_requested_output_subset_and_id(client):
    """What comes back is tested below the transports (tests/appliance/protocol/test_inference.py); here:
    the request's id and output names reach it, and the JSON answer carries only what was asked for."""
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    tensor = triton.InferInput("x", [2, 6], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("two_outputs", [tensor], outputs=[triton.InferRequestedOutput("square")],
                          request_id="req-42")
    response = result.get_response()
    assert response["id"] == "req-42"
    assert [o["name"] for o in response["outputs"]] == ["square"]
    assert result.as_numpy("double") is None
    np.testing.assert_array_equal(result.as_numpy("square"), x * x)


def test_version_paths(client):
    """The version in the path reaches the data plane (which version runs is tested there) and comes back
    in the answer."""
    x = np.ones((1, 8), np.float32)
    tensor = triton.InferInput("x", [1, 8], "FP32")
    tensor.set_data_from_numpy(x)
    for version in (1, 3):
        result = client.infer("affine", [tensor], model_version=str(version))
        np.testing.assert_allclose(result.as_numpy("y"), x * version + 10 * version)
        assert result.get_response()["model_version"] == str(version)
        assert client.is_model_ready("affine", str(version))
    assert client.infer("affine", [tensor]).get_response()["model_version"] == "3"
    assert client.get_model_metadata("affine", "2")["versions"] == ["1", "2", "3"]
    with pytest.raises(InferenceServerException, match="version 9 is not found"):
        client.infer("affine", [tensor], model_version="9")
    assert not client.is_model_ready("affine", "9")


def test_classification_extension(client):
    """class_count reaches the data plane (whose top classes are tested there) and its BYTES answer comes
    back as Triton's "value:index" strings."""
    x = np.random.default_rng(7).standard_normal((2, 784)).astype(np.float32)
    tensor = triton.InferInput("input", [2, 784], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("mlp", [tensor], outputs=[triton.InferRequestedOutput("probabilities", class_count=3)])
    top = result.as_numpy("probabilities")
    assert top.shape == (2, 3)
    for classes in top:
        values = [item.decode().split(":") for item in classes]
        assert [float(value) for value, _ in values] == sorted((float(value) for value, _ in values), reverse=True)
        assert all(0 <= int(index) < 10 for _, index in values)
