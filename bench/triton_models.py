"""The repository ``bench.triton`` serves with real Triton and with the appliance: Python-backend models
only (the one backend the pytriton wheel's tritonserver has), every instance KIND_CPU count 1.

- ``identity``: FP32[16] in, the same out; Triton's default scheduler (each request alone).
- ``identity_batched``: the same model with ``dynamic_batching {}`` (no queue delay).
- ``bls``: a Python model that calls ``identity`` with ``InferenceRequest.exec()`` per request.
- ``pipeline``: an ensemble of two Python steps (``step_a`` then ``step_b``, each an identity).
- ``accumulate``: a stateful model under the sequence batcher, ``direct`` strategy, 8 slots.
- ``repeat``: a decoupled model that answers each request with ``REPEATS`` responses, then the final flag.

``trusted=True`` marks every Python model ``in_process`` (the appliance's plan for models the operator
trusts; Triton ignores parameters it does not know), and pins that plan for ``bls``, which selection
cannot measure.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPEATS", "write_repository"]

REPEATS = 4

_IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())]) for request in requests]
'''

_BLS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUTPUT0"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
'''

# Direct strategy: each request is one sequence's next step; the START control input resets its sum.
_ACCUMULATE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = value.astype(np.int64).sum() + (0 if start.any() else self.sums.get(key, 0))
            self.sums[key] = total
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                                                         np.full(value.shape, total, dtype=np.int32))]))
        return responses
'''

_REPEAT = f'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for _ in range({REPEATS}):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_TENSORS = '''
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
'''
_ONE_INSTANCE = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"

_CONFIGS = {
    "identity": ("python", _IDENTITY, "max_batch_size: 8\n" + _TENSORS),
    "identity_batched": ("python", _IDENTITY, "max_batch_size: 8\n" + _TENSORS + "dynamic_batching { }\n"),
    "bls": ("python", _BLS, "max_batch_size: 8\n" + _TENSORS),
    "step_a": ("python", _IDENTITY, "max_batch_size: 8\n" + _TENSORS),
    "step_b": ("python", _IDENTITY, "max_batch_size: 8\n" + _TENSORS),
    "accumulate": ("python", _ACCUMULATE, '''max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
'''),
    "repeat": ("python", _REPEAT, "max_batch_size: 0\n" + _TENSORS.replace("dims: [ 16 ]", "dims: [ 1, 16 ]")
               + "model_transaction_policy { decoupled: true }\n"),
}

_ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 8
''' + _TENSORS + '''
ensemble_scheduling {
  step [
    { model_name: "step_a" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "middle" } },
    { model_name: "step_b" model_version: -1 input_map { key: "INPUT0" value: "middle" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
'''

_TRUSTED = 'parameters { key: "in_process" value: { string_value: "true" } }\n'
# A model that calls other models cannot be measured by selection (a tuning process serves no other
# model): the pin is the plan it gets when nothing could be measured.
_PINNED = 'parameters { key: "plan" value: { string_value: "python:in-process" } }\n'


def write_repository(root: Path, trusted: bool = False) -> Path:
    """Write every model under ``root`` (created); returns ``root``."""
    for name, (backend, source, config) in _CONFIGS.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(source.lstrip())
        text = f'backend: "{backend}"\n{config}{_ONE_INSTANCE}'
        if trusted:
            text += _TRUSTED + (_PINNED if name == "bls" else "")
        (root / name / "config.pbtxt").write_text(text)
    (root / "pipeline" / "1").mkdir(parents=True, exist_ok=True)
    (root / "pipeline" / "config.pbtxt").write_text(_ENSEMBLE.lstrip())
    return root
