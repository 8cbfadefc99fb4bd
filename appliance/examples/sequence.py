"""Stateful models for the sequence batcher, built with onnx.helper (deterministic, no download): an
accumulator in the manner of Triton's ``simple_sequence`` and a voice-activity-detector-like model whose
recurrent state is carried by the daemon (implicit state). Tests, the benchmark and the README's
streaming example use them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "FRAME",
    "accumulator_config",
    "accumulator_model",
    "vad_config",
    "vad_state_model",
    "write_sequence_model",
]

_OPSET = [helper.make_opsetid("", 17)]
_TYPES = {"FP32": TensorProto.FLOAT, "INT32": TensorProto.INT32, "BOOL": TensorProto.BOOL,
          "UINT64": TensorProto.UINT64, "INT64": TensorProto.INT64, "UINT32": TensorProto.UINT32,
          "BYTES": TensorProto.STRING}
_FORMS = {"FP32": "fp32_false_true: [ 0, 1 ]", "INT32": "int32_false_true: [ 0, 1 ]",
          "BOOL": "bool_false_true: [ false, true ]"}
FRAME = 512
"""Samples per frame of the VAD-like model: 32 ms at 16 kHz."""


def accumulator_model(control: str = "INT32", corrid: str | None = None) -> onnx.ModelProto:
    """OUTPUT = INPUT + the sum of the sequence's earlier INPUTs (restarting at START), all INT32 [batch, 1].

    The running sum is implicit state (ACC_IN -> ACC_OUT, kept by the daemon); START and READY are control
    tensors of datatype ``control`` (FP32, INT32 or BOOL); a row that is not READY leaves its state as it
    was. END comes back as END_OUT, and with ``corrid`` (its datatype) the CORRID control as CORRID_OUT."""
    kind = _TYPES[control]
    nodes = [
        helper.make_node("Cast", ["START"], ["start"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["READY"], ["ready"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["END"], ["END_OUT"], to=TensorProto.INT32),
        helper.make_node("Sub", ["INPUT", "INPUT"], ["zeros"]),
        helper.make_node("Where", ["start", "zeros", "ACC_IN"], ["base"]),
        helper.make_node("Add", ["base", "INPUT"], ["sum"]),
        helper.make_node("Where", ["ready", "sum", "zeros"], ["OUTPUT"]),
        helper.make_node("Where", ["ready", "sum", "ACC_IN"], ["ACC_OUT"]),
    ]
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("ACC_IN", TensorProto.INT32, ["batch", 1]),
        *(helper.make_tensor_value_info(name, kind, ["batch", 1]) for name in ("START", "END", "READY")),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("ACC_OUT", TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("END_OUT", TensorProto.INT32, ["batch", 1]),
    ]
    if corrid is not None:
        inputs.append(helper.make_tensor_value_info("CORRID", _TYPES[corrid], ["batch", 1]))
        outputs.append(helper.make_tensor_value_info("CORRID_OUT", _TYPES[corrid], ["batch", 1]))
        nodes.append(helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]))
    graph = helper.make_graph(nodes, "accumulator", inputs, outputs)
    return helper.make_model(graph, opset_imports=_OPSET)


def accumulator_config(strategy: str = "direct { }", control: str = "INT32", corrid: str | None = None,
                       max_batch_size: int = 8, instances: int = 1, idle_us: int = 0) -> str:
    """config.pbtxt for ``accumulator_model`` (the same ``control`` and ``corrid``)."""
    controls = [
        f'{{ name: "{name}" control [ {{ kind: {kind} {_FORMS[control]} }} ] }}'
        for name, kind in (("START", "CONTROL_SEQUENCE_START"), ("END", "CONTROL_SEQUENCE_END"),
                           ("READY", "CONTROL_SEQUENCE_READY"))
    ]
    outputs = [f'{{ name: "{name}" data_type: TYPE_INT32 dims: [ 1 ] }}' for name in ("OUTPUT", "END_OUT")]
    if corrid is not None:
        config_type = "TYPE_STRING" if corrid == "BYTES" else f"TYPE_{corrid}"
        controls.append(
            f'{{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {config_type} }} ] }}')
        outputs.append(f'{{ name: "CORRID_OUT" data_type: {config_type} dims: [ 1 ] }}')
    return f"""
max_batch_size: {max_batch_size}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [ {", ".join(controls)} ]
  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {", ".join(outputs)} ]
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
"""


def vad_state_model(frame: int = FRAME, seed: int = 0) -> onnx.ModelProto:
    """A recurrent voice-activity detector in miniature: input [batch, frame] FP32 and state
    [batch, 2, 128] FP32 -> prob [batch, 1] and stateN [batch, 2, 128], with
    stateN = tanh(0.9 * state + 0.1 * reshape(input @ W)) and prob = sigmoid(mean(stateN)): each frame's
    answer depends on every frame before it, through the state."""
    weights = (np.random.default_rng(seed).standard_normal((frame, 256)) / np.sqrt(frame)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["input", "w"], ["projected"]),
        helper.make_node("Reshape", ["projected", "state_shape"], ["drive"]),
        helper.make_node("Mul", ["state", "decay"], ["kept"]),
        helper.make_node("Mul", ["drive", "gain"], ["pushed"]),
        helper.make_node("Add", ["kept", "pushed"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["stateN"]),
        helper.make_node("Reshape", ["stateN", "flat_shape"], ["flat"]),
        helper.make_node("ReduceMean", ["flat"], ["level"], axes=[1], keepdims=1),
        helper.make_node("Sigmoid", ["level"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes,
        "vad_state",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", frame]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", 2, 128])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, ["batch", 2, 128])],
        initializer=[
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array([-1, 2, 128], np.int64), "state_shape"),
            numpy_helper.from_array(np.array(0.9, np.float32), "decay"),
            numpy_helper.from_array(np.array(0.1, np.float32), "gain"),
            numpy_helper.from_array(np.array([-1, 256], np.int64), "flat_shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=_OPSET)


def vad_config(strategy: str = "direct { }", max_batch_size: int = 64, instances: int = 1,
               idle_us: int = 0) -> str:
    """config.pbtxt for ``vad_state_model``: state/stateN as implicit state starting from zeros; clients
    send only their frames."""
    return f"""
max_batch_size: {max_batch_size}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  state [ {{ input_name: "state" output_name: "stateN" data_type: TYPE_FP32 dims: [ 2, 128 ]
            initial_state {{ data_type: TYPE_FP32 dims: [ 2, 128 ] zero_data: true name: "silence" }} }} ]
}}
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
"""


def write_sequence_model(repo: Path, name: str, model: onnx.ModelProto, config: str) -> Path:
    """``repo/name/1/model.onnx`` and ``repo/name/config.pbtxt``."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(version / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name
