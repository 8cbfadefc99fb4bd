"""Sleeps 40 ms and answers every request of the batch with SPAN = [start, end] (time.monotonic()): when
its instance ran. One config per model it serves: detector (1 accelerator, priority 1), classifier (1, 2),
greedy (2, 1)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.04)
        end = time.monotonic()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", np.array([start, end], np.float64))])
                for _ in requests]
