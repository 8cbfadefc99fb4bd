"""OUT = IN, on two instances that share a global rate-limiter resource (``bus``) and each hold an ``npu``:
one config per priority, named as the model it serves (detector 1, classifier 2)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
