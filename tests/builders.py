"""Models the tests build for themselves (onnx.helper, fixed seeds) and repository writers."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from appliance.core.tensors import numpy_dtype

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


def write_cache_repository(repo: Path) -> Path:
    """The response cache tests' repository: ``two_output_model`` twice with max_batch_size 8, as ``cached``
    (response_cache enabled) and ``uncached``."""
    for name, cache in (("cached", "response_cache { enable: true }\n"), ("uncached", "")):
        write_model(repo, name, two_output_model(), config="max_batch_size: 8\n" + cache)
    return repo


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


# Triton's quick-start densenet_onnx config (docs/examples/model_repository), at a smaller image size:
# the runtime's input is 4-D, clients send 3-D `dims`, and `reshape` bridges the two.
DENSENET_CONFIG = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {{
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, {size}, {size} ]
    reshape {{ shape: [ 1, 3, {size}, {size} ] }}
  }}
]
output [
  {{
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ {classes} ]
    reshape {{ shape: [ 1, {classes}, 1, 1 ] }}
  }}
]
"""


def densenet_like_model(size: int = 16, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """data_0 [1, 3, size, size] -> fc6_1 [1, classes, 1, 1], fixed shapes, like densenet's ONNX export."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["data_0", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Conv", ["g", "fw", "fb"], ["fc6_1"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "densenet_like",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, classes, 1, 1])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "cw"),
            numpy_helper.from_array(np.zeros(8, np.float32), "cb"),
            numpy_helper.from_array(rng.standard_normal((classes, 8, 1, 1)).astype(np.float32) * 0.3, "fw"),
            numpy_helper.from_array(np.zeros(classes, np.float32), "fb"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def vad_like_model(pad: int = 64) -> onnx.ModelProto:
    """Silero VAD's interface: input [batch, samples] FP32, state [2, batch, 128] FP32, sr INT64 scalar
    -> output [batch, 1], stateN [2, batch, 128]. The samples are reflect-padded by ``pad`` on both
    sides (as its STFT front end does), so any input of ``pad`` samples or fewer is refused."""
    nodes = [
        helper.make_node("Pad", ["input", "pads"], ["padded"], mode="reflect"),
        helper.make_node("ReduceMean", ["padded"], ["energy"], axes=[1], keepdims=1),
        helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["sr_f", "tiny"], ["sr_term"]),
        helper.make_node("Add", ["energy", "sr_term"], ["output"]),
        helper.make_node("Mul", ["state", "half"], ["stateN"]),
    ]
    graph = helper.make_graph(
        nodes,
        "vad_like",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 128]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 128]),
        ],
        initializer=[
            numpy_helper.from_array(np.array([0, pad, 0, pad], np.int64), "pads"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "tiny"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def framing_model(frame: int = 480) -> onnx.ModelProto:
    """audio [1, samples] FP32 (one channel) -> energy [1, frames]: the mean square of each
    ``frame``-sample window (30 ms at 16 kHz). Only whole frames are accepted: a sample count that is
    not a multiple of ``frame`` (every size the tuner tries on its own: 1, 16, 512, 16000) is refused."""
    nodes = [
        helper.make_node("Reshape", ["audio", "frame_shape"], ["frames"]),
        helper.make_node("Mul", ["frames", "frames"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["energy"], axes=[2], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "framing",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, "samples"])],
        [helper.make_tensor_value_info("energy", TensorProto.FLOAT, [1, "frames"])],
        initializer=[numpy_helper.from_array(np.array([1, -1, frame], np.int64), "frame_shape")],
    )
    return helper.make_model(graph, opset_imports=OPSET)


DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]
"""Every v2 datatype a backend here serves (BF16 has no numpy type)."""


def sample_tensor(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values of ``datatype`` that survive every encoding (integers within +-1000, short strings)."""
    rng = np.random.default_rng(seed)
    if datatype == "BYTES":
        return np.array([f"item-{i}".encode() for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    dtype = numpy_dtype(datatype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def mixed_outputs() -> dict[str, np.ndarray]:
    """A model's outputs of every kind an entry must carry: float, int, bool, bytes, bfloat16, a scalar, empty."""
    return {
        "y": np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4),
        "ids": np.array([[1, -2, 3]], np.int64),
        "flag": np.array([True, False]),
        "text": np.array([b"one", b"", b"three"], dtype=np.object_),
        "half": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
        "scalar": np.array(7, np.int32),
        "empty": np.zeros((0, 4), np.float16),
    }
