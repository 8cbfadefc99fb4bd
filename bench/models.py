"""Benchmark models, built deterministically with onnx.helper (no download, no torch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["cnn_model", "identity_model", "tiny_mlp_model", "write_repository"]

_OPSET = [helper.make_opsetid("", 17)]


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def tiny_mlp_model(seed: int = 0) -> onnx.ModelProto:
    """784 -> 10: one dense layer and a softmax (the 'tiny MLP' of the scheduler issue)."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        "tiny_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 784])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=[_init("w", rng.standard_normal((784, 10)) / 28), _init("b", np.zeros(10))],
    )
    return helper.make_model(graph, opset_imports=_OPSET)


def identity_model() -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0, 16 floats per item: the ONNX twin of the empty Python model."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
    )
    return helper.make_model(graph, opset_imports=_OPSET)


# An empty Python-backend model (Triton's identity example, reduced): what the backend itself costs.
_PY_IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''
_IDENTITY_CONFIG = """max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def cnn_model(seed: int = 0) -> onnx.ModelProto:
    """A small CNN over 3x112x112 images (~0.1 GMAC per image): four convolutions, pooling, a dense layer."""
    rng = np.random.default_rng(seed)
    layers = [(3, 32, 2), (32, 64, 1), (64, 64, 2), (64, 128, 2)]
    nodes, inits, prev = [], [], "image"
    for i, (cin, cout, stride) in enumerate(layers):
        w = rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))
        inits += [_init(f"w{i}", w), _init(f"b{i}", np.zeros(cout))]
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[3, 3],
                             strides=[stride, stride], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    inits += [_init("fw", rng.standard_normal((128, 10)) / 12), _init("fb", np.zeros(10))]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 112, 112])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=_OPSET)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_repository(root: Path, max_queue_delay_us: int = 0) -> Path:
    """tiny (dynamic batching), cnn_batched (dynamic batching), cnn_plain (each request alone), and the
    identity on 16 floats as an ONNX model (identity_onnx) and an empty Python model (identity_python)."""
    _save(tiny_mlp_model(), root / "tiny" / "1" / "model.onnx")
    (root / "tiny" / "config.pbtxt").write_text(
        f"max_batch_size: 16\ndynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"
    )
    for name in ("cnn_batched", "cnn_plain"):
        _save(cnn_model(), root / name / "1" / "model.onnx")
    (root / "cnn_batched" / "config.pbtxt").write_text(
        f"max_batch_size: 16\ndynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"
    )
    (root / "cnn_plain" / "config.pbtxt").write_text("max_batch_size: 16\n")
    _save(identity_model(), root / "identity_onnx" / "1" / "model.onnx")
    (root / "identity_onnx" / "config.pbtxt").write_text(_IDENTITY_CONFIG)
    (root / "identity_python" / "1").mkdir(parents=True, exist_ok=True)
    (root / "identity_python" / "1" / "model.py").write_text(_PY_IDENTITY)
    (root / "identity_python" / "config.pbtxt").write_text('backend: "python"\n' + _IDENTITY_CONFIG)
    return root
