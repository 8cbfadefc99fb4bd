"""Decoupled: echoes INPUT0 as OUTPUT0 in one response with the final flag; its config enables the
response cache, which Triton refuses for a decoupled model."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
