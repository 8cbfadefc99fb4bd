"""Sequence models the tests build: equivalents of Triton's example stateful models (written here from
their documented behaviour, not copied) and a Python accumulator; the Python models are files under
tests/models/sequence/.

- ``simple_sequence``: OUTPUT = READY * (INPUT + START) (START, READY int32 controls; direct).
- ``simple_dyna_sequence``: OUTPUT = READY * (INPUT + START + END * CORRID) (oldest, UINT64 CORRID).
- ``simple_string_dyna_sequence``: Triton's dyna_sequence backend with string IDs: an accumulator per
  sequence that starts at the first INPUT and adds the (numeric string) correlation ID at END.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from appliance.examples.sequence import write_sequence_model
from tests.models import MODELS, copy_model

_OPSET = [helper.make_opsetid("", 17)]
_INT = '{{ name: "{0}" control [ {{ kind: {1} int32_false_true: [ 0, 1 ] }} ] }}'


def simple_sequence_model(dyna: bool) -> onnx.ModelProto:
    names = ["INPUT", "START", *(["END"] if dyna else []), "READY"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1]) for n in names]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum0"])]
    if dyna:
        inputs.append(helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["batch", 1]))
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid32"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid32"], ["end_term"]),
            helper.make_node("Add", ["sum0", "end_term"], ["sum"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["sum0"], ["sum"]))
    nodes.append(helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"]))
    graph = helper.make_graph(nodes, "simple_sequence", inputs,
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1])])
    return helper.make_model(graph, opset_imports=_OPSET)


def simple_sequence_config(dyna: bool) -> str:
    controls = [_INT.format("START", "CONTROL_SEQUENCE_START")]
    if dyna:
        controls.append(_INT.format("END", "CONTROL_SEQUENCE_END"))
    controls.append(_INT.format("READY", "CONTROL_SEQUENCE_READY"))
    if dyna:
        controls.append('{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }')
    strategy = "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }" if dyna else ""
    return f"""
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  {strategy}
  control_input [ {", ".join(controls)} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {2 if dyna else 1} }} ]
"""


_SEQUENCE = MODELS / "sequence"

STRING_DYNA_PY = (_SEQUENCE / "simple_string_dyna_sequence" / "model.py").read_text()
STRING_DYNA_CONFIG = (_SEQUENCE / "simple_string_dyna_sequence" / "config.pbtxt").read_text()
PY_ACCUMULATOR = (_SEQUENCE / "py_accumulator" / "model.py").read_text()
"""The accumulator as a Python model under the direct strategy (one running sum per batch slot)."""
PY_ACCUMULATOR_CONFIG = (_SEQUENCE / "py_accumulator" / "config.pbtxt").read_text()


def write_triton_examples(repo: Path) -> Path:
    """The three models Triton's sequence client examples call."""
    for dyna, name in ((False, "simple_sequence"), (True, "simple_dyna_sequence")):
        write_sequence_model(repo, name, simple_sequence_model(dyna), simple_sequence_config(dyna))
    copy_model(repo, "sequence/simple_string_dyna_sequence")
    return repo
