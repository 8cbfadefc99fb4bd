"""The example models themselves, generated with onnx (imported only when a repository is generated, or
a test builds a model: the daemon serving an existing repository never loads onnx)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_example_repository", "mlp_model"]

_OPSET = [helper.make_opsetid("", 17)]


def _save(model: onnx.ModelProto, path: Path) -> None:
    model.ir_version = 8  # readable by every onnxruntime from 1.15 on
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _add_sub_model(element: int) -> onnx.ModelProto:
    string = element == TensorProto.STRING
    io = [helper.make_tensor_value_info(n, element, ["batch", 16]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, element, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = []
    a, b = "INPUT0", "INPUT1"
    if string:
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        ]
        a, b = "a", "b"
    sum_name, diff_name = ("sum", "diff") if string else ("OUTPUT0", "OUTPUT1")
    nodes += [helper.make_node("Add", [a, b], [sum_name]), helper.make_node("Sub", [a, b], [diff_name])]
    if string:
        nodes += [
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    graph = helper.make_graph(nodes, "add_sub", io, outs)
    return helper.make_model(graph, opset_imports=_OPSET, producer_name="appliance-examples")


def mlp_model(seed: int = 0, inputs: int = 784, hidden: int = 64, classes: int = 10) -> onnx.ModelProto:
    """A deterministic MLP classifier: input [batch, inputs] FP32 -> probabilities [batch, classes]."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((inputs, hidden)) / np.sqrt(inputs)).astype(np.float32)
    b1 = np.zeros(hidden, np.float32)
    w2 = (rng.standard_normal((hidden, classes)) / np.sqrt(hidden)).astype(np.float32)
    b2 = np.zeros(classes, np.float32)
    nodes = [
        helper.make_node("Gemm", ["input", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))],
    )
    return helper.make_model(graph, opset_imports=_OPSET, producer_name="appliance-examples")


_SIMPLE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: {dtype} dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: {dtype} dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: {dtype} dims: [ 16 ] }}
]
"""


def build_example_repository(target: Path) -> Path:
    """Write the example repository into ``target`` (which must not exist yet)."""
    for name, element, dtype in (
        ("simple", TensorProto.INT32, "TYPE_INT32"),
        ("simple_string", TensorProto.STRING, "TYPE_STRING"),
    ):
        _save(_add_sub_model(element), target / name / "1" / "model.onnx")
        (target / name / "config.pbtxt").write_text(_SIMPLE_CONFIG.format(name=name, dtype=dtype))
    _save(mlp_model(), target / "mlp" / "1" / "model.onnx")
    return target
