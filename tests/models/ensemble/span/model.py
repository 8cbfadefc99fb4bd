"""Sleeps 0.3 s and reports when it ran ([start, end], time.time()), on two instances."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _request in requests:
            start = time.time()
            time.sleep(0.3)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SPAN", np.array([start, time.time()], np.float64))]))
        return responses
