"""Sends IN three times during execute(), each response too large to travel in its message, then waits
(up to 10 s) until the daemon has given back the blocks they took, and ends with OUT = [blocks still
lent]: 0 when the model process read the daemon's Free messages while execute() ran."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

from appliance.backends.python.model_process.pb import runtime


class TritonPythonModel:
    def execute(self, requests):
        blocks = runtime.current().blocks
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values)]))
            deadline = time.monotonic() + 10
            while blocks.in_use and time.monotonic() < deadline:
                time.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([blocks.in_use], np.float32))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
