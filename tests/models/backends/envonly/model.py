"""Imports envonly_pkg, which only its EXECUTION_ENV_PATH environment holds; TEXT is its greeting and
sys.prefix."""

import sys

import numpy as np
import triton_python_backend_utils as pb_utils
from envonly_pkg import greeting


class TritonPythonModel:
    def execute(self, requests):
        text = np.array([[greeting().encode(), sys.prefix.encode()]], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]) for _ in requests]
