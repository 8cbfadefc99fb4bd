"""A Python step that sleeps 0.3 s and reports when it ran (time.time() at start and end, per item), so a test
can tell whether two steps overlapped; a negative first value fails the request."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.flat[0] < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            start = time.time()
            time.sleep(0.3)
            span = np.array([[start, time.time()]] * len(x), dtype=np.float64)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("y", x), pb_utils.Tensor("span", span)]))
        return responses
