"""Repositories as users lay them out: with and without config.pbtxt, broken models beside good ones,
and the built-in example repository."""

from __future__ import annotations

import numpy as np
import tritonclient.http as triton

from tests.builders import affine_model, identity_model, write_model
from tests.http_util import call


def test_broken_models_are_listed_with_reasons_while_others_serve(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "good", affine_model(2.0, 1.0))
    write_model(repo, "with_config", identity_model(["INT32"]), config=(
        'name: "with_config"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'
        'input [ { name: "IN_INT32" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT_INT32" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'))
    (repo / "garbage_file" / "1").mkdir(parents=True)
    (repo / "garbage_file" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    write_model(repo, "bad_config", affine_model(1, 1), config="max_batch_size: [oops")
    (repo / "no_versions").mkdir()
    (repo / "no_versions" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    write_model(repo, "wrong_input", affine_model(1, 1), config=(
        'input [ { name: "image" data_type: TYPE_FP32 dims: [ 8 ] } ]\n'))
    write_model(repo, "fixed_batch", identity_model(["FP32"], batch=False), config="max_batch_size: 8\n")
    write_model(repo, "unknown_backend", affine_model(1, 1), config='backend: "tensorflow"\n')
    (repo / "empty_version" / "1").mkdir(parents=True)
    (repo / "empty_version" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    daemon = start_daemon(repo)

    with triton.InferenceServerClient(daemon.url) as client:
        assert client.is_server_live()
        assert not client.is_server_ready()  # strict readiness, as Triton: some models failed
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["good"]["state"] == "READY"
        assert index["with_config"]["state"] == "READY"
        reasons = {
            "garbage_file": "onnxruntime cannot load",
            "bad_config": "not a valid Triton model configuration",
            "no_versions": "has no version directory; expected no_versions/1/",
            "wrong_input": "config input 'image' is not in the model; the model's inputs are ['x']",
            "fixed_batch": "set max_batch_size: 0",
            "unknown_backend": "unknown backend/platform 'tensorflow'",
            "empty_version": "expected empty_version/1/model.onnx",
        }
        for name, reason in reasons.items():
            assert index[name]["state"] == "UNAVAILABLE", name
            assert reason in index[name]["reason"], (name, index[name]["reason"])
            assert not client.is_model_ready(name)

        x = np.ones((1, 8), np.float32)
        tensor = triton.InferInput("x", [1, 8], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("good", [tensor]).as_numpy("y"), x * 2 + 1)
        assert client.get_model_config("with_config")["max_batch_size"] == 2

    status, _, payload = call(daemon.port, "POST", "/v2/models/garbage_file/infer", {"inputs": []})
    assert status == 404 and "has no available versions; " in payload["error"]  # Triton's words, then why
    assert "onnxruntime cannot load" in payload["error"]
    status, _, payload = call(daemon.port, "POST", "/v2/repository/index", {"ready": True})
    assert {row["name"] for row in payload} == {"good", "with_config"}
    assert "failed to load" in daemon.log()


def test_non_strict_readiness_ignores_broken_models(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "good", affine_model(2.0, 1.0))
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"nope")
    daemon = start_daemon(repo, "--no-strict-readiness")
    with triton.InferenceServerClient(daemon.url) as client:
        assert client.is_server_ready()


def test_failed_version_is_reported_while_others_serve(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "model", affine_model(1.0, 0.0), version=1, config="version_policy: { all { } }\n")
    (repo / "model" / "2").mkdir()
    (repo / "model" / "2" / "model.onnx").write_bytes(b"truncated")
    daemon = start_daemon(repo)
    with triton.InferenceServerClient(daemon.url) as client:
        index = client.get_model_repository_index()
        states = {row.get("version"): row["state"] for row in index}
        assert states == {"1": "READY", "2": "UNAVAILABLE"}
        assert client.is_model_ready("model", "1")
        assert not client.is_model_ready("model", "2")
    status, _, payload = call(daemon.port, "GET", "/v2/models/model/versions/2")
    assert status == 404 and "'model' version 2 is not found; it failed to load: " in payload["error"]
    assert "onnxruntime cannot load" in payload["error"]


def test_missing_repository_fails_fast(start_daemon, tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
         "--host", "127.0.0.1", "--http-port", "0", "--no-mdns",
         "--state-dir", str(tmp_path), "--model-repository", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "--model-repository" in result.stderr


def test_builtin_example_repository(start_daemon):
    daemon = start_daemon(None, selection=True)  # what `make serve` runs: measured selection on
    with triton.InferenceServerClient(daemon.url) as client:
        assert client.is_server_ready()
        names = {row["name"] for row in client.get_model_repository_index()}
        assert {"simple", "simple_string", "mlp"} <= names
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        strings = [triton.InferInput("INPUT0", [1, 16], "BYTES"), triton.InferInput("INPUT1", [1, 16], "BYTES")]
        strings[0].set_data_from_numpy(a.astype(str).astype(object))
        strings[1].set_data_from_numpy(b.astype(str).astype(object))
        result = client.infer("simple_string", strings)
        assert [int(v) for v in result.as_numpy("OUTPUT0").ravel()] == list((a + b).ravel())
