"""One network, five backends: ONNX, OpenVINO (IR and ONNX), TorchScript, torch.export and a numpy
model.py, served from one repository and compared through tritonclient."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.models import MODELS, copy_model

torch = pytest.importorskip("torch")
ov = pytest.importorskip("openvino")

BATCH = 3


def _network():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    ).eval()


def _write(repo, name, filename, config=None):
    folder = repo / name / "1"
    folder.mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return folder / filename


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    net = _network()
    example = torch.randn(2, 3, 8, 8)
    onnx_path = _write(repo, "cnn_onnx", "model.onnx")
    with warnings.catch_warnings():
        # torch's legacy (TorchScript-based) ONNX exporter is deprecated as a whole, and it calls its own
        # deprecated helpers; its torch.export-based successor needs onnxscript, which the appliance does not
        # depend on. Only this call's deprecations are let through.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (example,), str(onnx_path), input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
    ov.save_model(ov.convert_model(str(onnx_path)), str(_write(repo, "cnn_openvino", "model.xml")),
                  compress_to_fp16=False)
    shutil.copy(onnx_path, _write(repo, "cnn_openvino_onnx", "model.onnx",
                                  'backend: "openvino"\ndefault_model_filename: "model.onnx"\n'))
    torch.jit.trace(net, example).save(str(_write(repo, "cnn_torchscript", "model.pt", (
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'))))
    program = torch.export.export(net, (example,), dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    torch.export.save(program, str(_write(repo, "cnn_export", "model.pt2")))
    model_py = _write(repo, "cnn_python", "model.py")
    shutil.copyfile(MODELS / "simple" / "numpy_cnn" / "model.py", model_py)  # no config: auto_complete_config()
    for key, tensor in (("cw", net[0].weight), ("cb", net[0].bias), ("lw", net[4].weight), ("lb", net[4].bias)):
        np.save(model_py.parent / f"{key}.npy", tensor.detach().numpy())
    for name in ("add_sub", "raises", "wrong_count", "exits", "request_error"):
        copy_model(repo, f"simple/{name}")
    torch.jit.trace(net, example).save(str(_write(repo, "torchscript_no_config", "model.pt")))
    return repo


CNN_MODELS = {
    "cnn_onnx": ("image", "logits", "onnxruntime_onnx"),
    "cnn_openvino": ("image", "logits", "openvino"),
    "cnn_openvino_onnx": ("image", "logits", "openvino"),
    "cnn_torchscript": ("INPUT__0", "OUTPUT__0", "pytorch_libtorch"),
    "cnn_export": ("input", "OUTPUT__0", "torch_aoti"),
    "cnn_python": ("image", "logits", "python"),
}


@pytest.mark.parametrize("model", list(CNN_MODELS))
def test_every_backend_computes_the_same_network(client, model):
    input_name, output_name, platform = CNN_MODELS[model]
    x = np.random.default_rng(1).standard_normal((BATCH, 3, 8, 8)).astype(np.float32)
    expected = _network()(torch.from_numpy(x)).detach().numpy()
    tensor = triton.InferInput(input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor])
    np.testing.assert_allclose(result.as_numpy(output_name), expected, rtol=1e-4, atol=1e-5)
    metadata = client.get_model_metadata(model)
    assert metadata["platform"] == platform
    assert metadata["inputs"][0]["shape"][0] == -1  # every one of them batches


def test_python_model_auto_completes_its_config(client):
    config = client.get_model_config("cnn_python")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["image"]


def test_triton_add_sub_example_runs_unchanged(client):
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    inputs = [triton.InferInput("INPUT0", [4], "FP32"), triton.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _x(value: float, batched: bool = False) -> list:
    tensor = triton.InferInput("x", [1, 2] if batched else [2], "FP32")
    tensor.set_data_from_numpy(np.full((1, 2) if batched else (2,), value, np.float32))
    return [tensor]


@pytest.mark.parametrize("model,status,message", [
    ("raises", "500", "this model always fails"),
    ("wrong_count", "500", r"InferenceRequest\(s\) size is:1, and InferenceResponse\(s\) size is:0"),
    ("request_error", "400", "x must be positive"),
])
def test_failing_python_models_fail_cleanly(client, model, status, message):
    with pytest.raises(InferenceServerException, match=message) as info:
        client.infer(model, _x(1.0))
    assert info.value.status() == status
    np.testing.assert_array_equal(client.infer("add_sub", [
        *_named_inputs(np.ones(4, np.float32))]).as_numpy("OUTPUT0"), np.full(4, 2, np.float32))


def _named_inputs(value):
    inputs = [triton.InferInput("INPUT0", [4], "FP32"), triton.InferInput("INPUT1", [4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(value)
    return inputs


def test_model_process_that_dies_is_reported_and_restarted(client):
    with pytest.raises(InferenceServerException, match="exited with code 3") as info:
        client.infer("exits", _x(-1.0, batched=True))
    assert info.value.status() == "500"
    result = client.infer("exits", _x(2.0, batched=True))  # a fresh process serves the next request
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 2), 4.0, np.float32))
    assert client.is_model_ready("cnn_onnx")


def test_torchscript_without_config_says_what_to_write(client):
    index = {row["name"]: row for row in client.get_model_repository_index()}
    reason = index["torchscript_no_config"]["reason"]
    assert index["torchscript_no_config"]["state"] == "UNAVAILABLE"
    assert "needs a config.pbtxt such as" in reason and 'name: "INPUT__0"' in reason


def test_onnx_only_daemon_imports_neither_torch_nor_openvino(tmp_path):
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    from appliance.examples import mlp_model
    from tests.builders import save

    save(mlp_model(), repo / "m" / "1" / "model.onnx")
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from appliance.rest.app import build_app\n"
        "from appliance.composition import compose\n"
        "from appliance.settings import Settings\n"
        "async def main():\n"
        f"    settings = Settings.build(state_dir=Path({str(tmp_path / 'state')!r}),\n"
        f"                              model_repository=Path({str(repo)!r}), selection=False)\n"
        "    appliance = await compose(settings)\n"
        "    build_app(appliance.dataplane, appliance.rest)\n"
        "    await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)\n"
        "    assert appliance.registry.ready_count() == 1\n"
        "    await appliance.close()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in ('torch', 'openvino', 'tensorrt') if m in sys.modules))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


@pytest.mark.parametrize("first,second", [("openvino", "onnxruntime"), ("onnxruntime", "openvino")])
def test_runtimes_import_in_either_order(first, second, repository):
    code = (
        f"import {first}, {second}\n"
        "import numpy as np, onnxruntime as ort, openvino as ov\n"
        f"path = {str(repository / 'cnn_onnx' / '1' / 'model.onnx')!r}\n"
        "x = np.ones((1, 3, 8, 8), np.float32)\n"
        "a = ort.InferenceSession(path).run(None, {'image': x})[0]\n"
        "b = ov.Core().compile_model(path, 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})(x)[0]\n"
        "assert np.allclose(a, b, atol=1e-5)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(_importable("tensorrt"), reason="tensorrt is installed here")
def test_missing_runtime_makes_only_its_model_unavailable(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    (repo / "engine" / "1").mkdir(parents=True)
    (repo / "engine" / "1" / "model.plan").write_bytes(b"not loaded anyway")
    (repo / "engine" / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    daemon = start_daemon(repo)
    with triton.InferenceServerClient(daemon.url) as client:
        (row,) = client.get_model_repository_index()
    assert row["state"] == "UNAVAILABLE"
    assert "backend 'tensorrt' is unavailable" in row["reason"] and "install the 'nvidia' extra" in row["reason"]
