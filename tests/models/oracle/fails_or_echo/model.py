"""Echoes INPUT0 as OUTPUT0, but raises for a negative first element: successes and failures to count."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if float(x.reshape(-1)[0]) < 0:
                raise pb_utils.TritonModelException("negative input raised")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
