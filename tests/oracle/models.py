"""The repository of Python-backend models that real Triton and the appliance both serve.

Triton's wheel carries only the Python backend, so every model here is a model.py written as
NVIDIA's examples are. Each one exists for a part of the protocol the corpus exercises.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["IDENTITY", "IDENTITY_CONFIG", "LABELLED_CONFIG", "LABELS", "MODELS", "write_python_model",
           "write_repository"]

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return responses
'''

IDENTITY_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# The corpus's identity: its output has labels, for classification.
LABELLED_CONFIG = IDENTITY_CONFIG.replace('OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }',
                                          'OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" }')

LABELS = "zero\none\ntwo\nthree\nfour\nfive\nsix\nseven\n"

ADD_SUB = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = {name: pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)
                                                             ["data_type"]) for name in ("OUTPUT0", "OUTPUT1")}

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtypes["OUTPUT0"])),
                       pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtypes["OUTPUT1"]))]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''

ADD_SUB_CONFIG = '''
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

DOUBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
'''

DOUBLE_CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

PIPELINE_CONFIG = '''
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "DOUBLED_SUM" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "DIFFERENCE" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" }
      output_map { key: "OUTPUT1" value: "DIFFERENCE" }
    },
    {
      model_name: "double"
      model_version: -1
      input_map { key: "X" value: "sum" }
      output_map { key: "Y" value: "DOUBLED_SUM" }
    }
  ]
}
'''

STRINGS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", text.astype(np.object_))]))
        return responses
'''

STRINGS_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# For generate and generate_stream: JSON keys name the inputs, the outputs come back as keys.
TEXT = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            upper = np.array([item.decode().upper().encode() for item in text.reshape(-1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", upper.reshape(text.shape))]))
        return responses
'''

TEXT_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# Decoupled: one response per element of IN (OUT the element, IDX its index), then the final flag alone.
REPEAT = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

REPEAT_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# Sequence: OUTPUT is the running sum of INPUT over the sequence (START resets it).
ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            end = int(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0])
            key = request.correlation_id()
            total = value + (0 if start else self.sums.get(key, 0))
            if end:
                self.sums.pop(key, None)
            else:
                self.sums[key] = total
            output = np.array([[total]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
'''

ACCUMULATOR_CONFIG = '''
backend: "python"
max_batch_size: 1
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# A response carrying the model's own error, and an execute that raises: the two ways a model fails.
FAILS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if float(x.reshape(-1)[0]) < 0:
            raise pb_utils.TritonModelException("negative input raised")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("the model refused this request"))
                for _ in requests]
'''

FAILS_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''

# Echoes INPUT0 as OUTPUT0, but raises for a negative first element: successes and failures to count.
FAILS_OR_ECHO = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if float(x.reshape(-1)[0]) < 0:
                raise pb_utils.TritonModelException("negative input raised")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''

MODELS: dict[str, tuple[str, str]] = {
    "identity": (IDENTITY, LABELLED_CONFIG),
    "add_sub": (ADD_SUB, ADD_SUB_CONFIG),
    "double": (DOUBLE, DOUBLE_CONFIG),
    "strings": (STRINGS, STRINGS_CONFIG),
    "text": (TEXT, TEXT_CONFIG),
    "repeat": (REPEAT, REPEAT_CONFIG),
    "accumulator": (ACCUMULATOR, ACCUMULATOR_CONFIG),
    "fails": (FAILS, FAILS_CONFIG),
    # A second copy of identity: unloaded and loaded again by the corpus while the rest keeps serving.
    "spare": (IDENTITY, LABELLED_CONFIG),
    # Copies that only the statistics cases call, so their counts do not hang on every other case.
    "counted": (FAILS_OR_ECHO, FAILS_CONFIG),
    "counted_repeat": (REPEAT, REPEAT_CONFIG),
}
"""name -> (model.py, config.pbtxt) for every Python model; the ensemble ``pipeline`` comes on top."""


def write_python_model(repository: Path, name: str, source: str, config: str, version: int = 1) -> Path:
    """repository/name/config.pbtxt and repository/name/<version>/model.py; returns the model directory."""
    model = repository / name
    (model / str(version)).mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(config.strip() + "\n")
    (model / str(version) / "model.py").write_text(source.lstrip())
    return model


def write_repository(repository: Path) -> Path:
    """Every model above, the labels file, and the ensemble ``pipeline`` (add_sub then double)."""
    for name, (source, config) in MODELS.items():
        write_python_model(repository, name, source, config)
    for name in ("identity", "spare"):
        (repository / name / "labels.txt").write_text(LABELS)
    (repository / "pipeline" / "1").mkdir(parents=True, exist_ok=True)
    (repository / "pipeline" / "config.pbtxt").write_text(PIPELINE_CONFIG.strip() + "\n")
    return repository
