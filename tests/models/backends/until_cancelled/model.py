"""Streams IN every 50 ms, up to COUNT responses; unless IGNORE is set it checks is_cancelled() before each
one and, once cancelled, ends with a CANCELLED error (Triton's response_sender_until_cancelled)."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            ignore = bool(pb_utils.get_input_tensor_by_name(request, "IGNORE").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(count):
                if not ignore and request.is_cancelled():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "request has been cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                time.sleep(0.05)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
