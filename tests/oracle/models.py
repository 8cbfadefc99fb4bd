"""Python-backend models that real Triton and the appliance both serve, written into a repository."""

from __future__ import annotations

from pathlib import Path

__all__ = ["IDENTITY", "IDENTITY_CONFIG", "write_python_model"]

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


def write_python_model(repository: Path, name: str, source: str, config: str, version: int = 1) -> Path:
    """repository/name/config.pbtxt and repository/name/<version>/model.py; returns the model directory."""
    model = repository / name
    (model / str(version)).mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(config.strip() + "\n")
    (model / str(version) / "model.py").write_text(source.lstrip())
    return model
