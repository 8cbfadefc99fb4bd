"""OUT_BYTES = IN_BYTES: raw binary strings through a Python model."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUT_BYTES", pb_utils.get_input_tensor_by_name(r, "IN_BYTES").as_numpy())]) for r in requests]
