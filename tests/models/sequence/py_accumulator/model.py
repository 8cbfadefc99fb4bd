"""The accumulator under the direct strategy: like Triton's stateful backends it keeps one running sum
per batch slot, and a request's position in the batch is its slot. Each response names the thread its batch
ran on as the response parameter "thread" (in_process.pbtxt serves it trusted, in the daemon's process)."""

import functools
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for slot, request in enumerate(requests):
            value = functools.partial(_value, request)
            ready = bool(value("READY").any())
            if ready:
                base = 0 if value("START").any() else self.sums.get(slot, 0)
                self.sums[slot] = base + int(value("INPUT").sum())
            out = np.full((1, 1), self.sums.get(slot, 0) if ready else 0, np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)],
                                                        parameters={"thread": threading.current_thread().name}))
        return responses
