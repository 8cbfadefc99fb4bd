"""y = x + OFFSET, OFFSET from lib/helper.py in the model's directory (which the test writes and changes)."""

import numpy as np
import triton_python_backend_utils as pb_utils
from lib.helper import OFFSET


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + np.float32(OFFSET))]) for r in requests]
