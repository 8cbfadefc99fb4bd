"""Doubles its input; an input whose first element is -1 ends the process (code 3) in the middle of
execute()."""

import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if data.flat[0] == -1:
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)]))
        return responses
