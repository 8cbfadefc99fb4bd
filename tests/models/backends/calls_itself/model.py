"""One instance; IN > 0 calls this same model with IN - 1 and answers what that call gave (its error text
and code, if any); IN == 0 answers at once."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            text = b"done"
            if value > 0:
                inner = pb_utils.InferenceRequest(
                    model_name="calls_itself", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([value - 1], np.int32))]).exec()
                if inner.has_error():
                    text = f"{inner.error().code()}|{inner.error().message()}".encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=object))]))
        return responses
