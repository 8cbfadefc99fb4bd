"""OUT is IN, sent as the one response with the final flag (decoupled)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
            request.get_response_sender().send(pb_utils.InferenceResponse([out]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
