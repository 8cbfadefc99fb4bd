"""Decoupled: one response per element of IN (OUT the element, IDX its index), then the final flag alone."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
