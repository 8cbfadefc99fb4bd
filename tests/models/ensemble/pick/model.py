"""OUT = A + B, or A + 100 when the optional B is not sent."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", a + (b.as_numpy() if b else 100))]))
        return responses
