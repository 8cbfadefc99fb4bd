"""Sequence models the tests build: equivalents of Triton's example stateful models (written here from
their documented behaviour, not copied) and a Python accumulator.

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
from tests.models import write_python_model

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


STRING_DYNA_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            corrid = value("CORRID").reshape(-1)[0].decode()
            if not value("READY").any():
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.zeros((1, 1), np.int32))]))
                continue
            total = int(value("INPUT").sum()) + (0 if value("START").any() else self.sums.get(corrid, 0))
            self.sums[corrid] = total
            out = total + (int(corrid) if value("END").any() else 0)
            if value("END").any():
                self.sums.pop(corrid, None)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.full((1, 1), out, np.int32))]))
        return responses
'''

STRING_DYNA_CONFIG = '''
backend: "python"
max_batch_size: 8
sequence_batching {
  oldest { max_candidate_sequences: 64 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# The accumulator as a Python model under the direct strategy: like Triton's stateful backends it keeps
# one running sum per batch slot, and a request's position in the batch is its slot.
PY_ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for slot, request in enumerate(requests):
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            ready = bool(value("READY").any())
            if ready:
                base = 0 if value("START").any() else self.sums.get(slot, 0)
                self.sums[slot] = base + int(value("INPUT").sum())
            out = np.full((1, 1), self.sums.get(slot, 0) if ready else 0, np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
'''

PY_ACCUMULATOR_CONFIG = '''
backend: "python"
max_batch_size: 4
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''


def write_triton_examples(repo: Path) -> Path:
    """The three models Triton's sequence client examples call."""
    for dyna, name in ((False, "simple_sequence"), (True, "simple_dyna_sequence")):
        write_sequence_model(repo, name, simple_sequence_model(dyna), simple_sequence_config(dyna))
    write_python_model(repo, "simple_string_dyna_sequence", STRING_DYNA_PY, STRING_DYNA_CONFIG)
    return repo
