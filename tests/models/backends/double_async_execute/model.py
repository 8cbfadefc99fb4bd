"""OUT is IN * 2, from a coroutine execute()."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() * 2)]) for r in requests]
