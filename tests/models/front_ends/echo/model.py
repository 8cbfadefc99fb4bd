"""OUT = IN, FP32 [2]: a model with no async execute, no BLS and no BF16 tensor, whose process should
load none of their libraries."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]) for x in inputs]
