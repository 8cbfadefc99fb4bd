"""Y = X * X after sleeping X / 10 s, on two instances: a larger value that comes first finishes last, so the
order of an ensemble's responses is its own doing, not the step's."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(max(int(x[0]), 0) / 10)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * x).astype(np.int32))]))
        return responses
