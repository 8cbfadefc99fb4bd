"""Sleeps x[0] seconds, then echoes x: a request that takes as long as asked. It logs
"sleepy: sleeping <x[0]> s" (the daemon's log) as it starts: the request is running in the model."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            pb_utils.Logger.log_info(f"sleepy: sleeping {float(x.ravel()[0]):g} s")
            time.sleep(float(x.ravel()[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return responses
