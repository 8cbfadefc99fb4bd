"""A response carrying the model's own error, and an execute that raises (a negative first value): the
two ways a model fails."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if float(x.reshape(-1)[0]) < 0:
            raise pb_utils.TritonModelException("negative input raised")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("the model refused this request"))
                for _ in requests]
