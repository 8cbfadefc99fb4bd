"""y = 2x after 4 ms a request, one request at a time per box, whatever the CPU: the boxes of the fleet
scenario share two busy cores, and a CPU-bound model would make them as unequal as the scheduler makes their
processes (a real fleet has a machine per box)."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            time.sleep(0.004)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]))
        return responses
