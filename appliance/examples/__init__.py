"""The built-in example repository, generated deterministically (fixed seeds, no network) on first use.

- ``simple``: Triton's quick-start model: INPUT0 + INPUT1 and INPUT0 - INPUT1 over INT32 [16], batched.
- ``simple_string``: the same over numbers written as strings (BYTES), as Triton's example.
- ``mlp``: a tiny 784->64->10 classifier with no config.pbtxt: its config is auto-completed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from appliance.state import StateDir

__all__ = ["GENERATION", "build_example_repository", "ensure_example_repository", "example_repository",
           "mlp_model"]

# Bump when the generated models change, so existing state dirs regenerate them.
GENERATION = "1"
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
    (target / ".generation").write_text(GENERATION)
    return target


def ensure_example_repository(target: Path) -> Path:
    """Generate the repository once (atomically: build beside it, then rename) and return it."""
    stamp = target / ".generation"
    if stamp.is_file() and stamp.read_text() == GENERATION:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".example-", dir=target.parent))
    try:
        build_example_repository(staging / "repo")
        if target.exists():
            shutil.rmtree(target)
        (staging / "repo").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def example_repository(target: Path, state: StateDir) -> tuple[Path, Path | None]:
    """The example repository in ``target`` (generated once), and None; where ``target`` cannot be
    written (a read-only state dir without a current copy), one generated in a new temporary directory,
    and that directory, for the caller to remove when it stops serving."""
    try:
        return ensure_example_repository(target), None
    except OSError as exc:
        scratch = Path(tempfile.mkdtemp(prefix="appliance-examples-"))
        state.note("example_repository_temporary",
                   f"the example repository cannot be written to {target} ({exc.strerror or exc}): generated "
                   f"in {scratch} for this run instead",
                   "make the state dir writable, or serve your own repository (--model-repository)")
        return build_example_repository(scratch / "repo"), scratch
