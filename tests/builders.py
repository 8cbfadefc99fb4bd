"""Models the tests build for themselves (onnx.helper, fixed seeds) and repository writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]

# v2 datatype -> ONNX element type, for the identity model.
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def identity_model(datatypes: list[str], batch: bool = True) -> onnx.ModelProto:
    """IN_<T> -> OUT_<T> for each datatype, shape [batch, 4] (or [4, 4] when not batching)."""
    first = "batch" if batch else 4
    inputs, outputs, nodes = [], [], []
    for dt in datatypes:
        inputs.append(helper.make_tensor_value_info(f"IN_{dt}", ONNX_TYPES[dt], [first, 4]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{dt}", ONNX_TYPES[dt], [first, 4]))
        nodes.append(helper.make_node("Identity", [f"IN_{dt}"], [f"OUT_{dt}"]))
    return helper.make_model(helper.make_graph(nodes, "identity", inputs, outputs), opset_imports=OPSET)


def affine_model(scale: float, offset: float, width: int = 8) -> onnx.ModelProto:
    """y = x * scale + offset over FP32 [batch, width]; versions differ by their constants."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["t"]),
        helper.make_node("Add", ["t", "offset"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=[
            numpy_helper.from_array(np.array([scale], np.float32), "scale"),
            numpy_helper.from_array(np.array([offset], np.float32), "offset"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def two_output_model(width: int = 6) -> onnx.ModelProto:
    """x -> (double = 2x, square = x*x), both FP32 [batch, width]."""
    nodes = [
        helper.make_node("Add", ["x", "x"], ["double"]),
        helper.make_node("Mul", ["x", "x"], ["square"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [
            helper.make_tensor_value_info("double", TensorProto.FLOAT, ["batch", width]),
            helper.make_tensor_value_info("square", TensorProto.FLOAT, ["batch", width]),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def write_model(repo: Path, name: str, model: onnx.ModelProto, version: int = 1, config: str | None = None) -> Path:
    save(model, repo / name / str(version) / "model.onnx")
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def cnn_model(seed: int = 0) -> onnx.ModelProto:
    """A small CNN: image [batch, 3, 16, 16] -> logits [batch, 5] (conv, relu, global pool, dense)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["image", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "dw", "db"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "cw"),
            numpy_helper.from_array(np.zeros(8, np.float32), "cb"),
            numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32) * 0.3, "dw"),
            numpy_helper.from_array(np.zeros(5, np.float32), "db"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)
