"""Decoupled: sends nothing, then the final flag alone (zero responses), and tries a second final flag;
a negative IN gets an error response instead."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if values[0] < 0:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative", pb_utils.TritonError.INVALID_ARG)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_info(f"second final refused: {exc}")
        return None
