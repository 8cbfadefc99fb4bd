"""For generate and generate_stream: text_output is text_input in upper case."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            upper = np.array([item.decode().upper().encode() for item in text.reshape(-1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", upper.reshape(text.shape))]))
        return responses
