"""TensorRT: build an engine from an ONNX model on this GPU, serve it, compare with onnxruntime.

Skipped where there is no CUDA GPU or no tensorrt package (the nvidia flavour); bench/gpu_checks.sh
runs these and the other GPU tests on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from appliance.examples import mlp_model
from tests.builders import save

torch = pytest.importorskip("torch")
trt = pytest.importorskip("tensorrt")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="TensorRT needs a CUDA GPU")]


def _build_engine(onnx_path, plan_path, max_batch: int = 8) -> None:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    profile = builder.create_optimization_profile()
    profile.set_shape("input", (1, 784), (max_batch, 784), (max_batch, 784))
    config = builder.create_builder_config()
    config.add_optimization_profile(profile)
    plan_path.write_bytes(bytes(builder.build_serialized_network(network, config)))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    onnx_path = save(mlp_model(seed=11), repo / "reference.onnx")
    (repo / "mlp_trt" / "1").mkdir(parents=True)
    _build_engine(onnx_path, repo / "mlp_trt" / "1" / "model.plan")
    (repo / "mlp_trt" / "config.pbtxt").write_text(
        'platform: "tensorrt_plan"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_GPU count: 1 } ]\n')
    return repo


def test_tensorrt_engine_matches_onnxruntime(module_daemon, repository):
    daemon = module_daemon(repository)
    x = np.random.default_rng(0).standard_normal((4, 784)).astype(np.float32)
    expected = ort.InferenceSession(str(repository / "reference.onnx")).run(None, {"input": x})[0]
    with triton.InferenceServerClient(daemon.url) as client:
        config = client.get_model_config("mlp_trt")
        assert config["input"][0]["dims"] == [784]
        tensor = triton.InferInput("input", [4, 784], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("mlp_trt", [tensor]).as_numpy("probabilities")
    np.testing.assert_allclose(result, expected, rtol=1e-3, atol=1e-4)
