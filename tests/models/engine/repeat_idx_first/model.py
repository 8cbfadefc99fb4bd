"""Decoupled: one response per element of IN, IDX then OUT, as NVIDIA's repeat example."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index, value in enumerate(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                                                        pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
