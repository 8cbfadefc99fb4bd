"""Sequence: OUTPUT is the running sum of INPUT over the sequence (START resets it)."""

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
