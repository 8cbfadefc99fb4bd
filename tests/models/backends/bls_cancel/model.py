"""Sums the streamed responses of until_cancelled and cancels the stream once the sum reaches MAX_SUM
(Triton's decoupled_bls_cancel); answers SUM, whether a CANCELLED error came back, and the responses read."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            max_sum = int(pb_utils.get_input_tensor_by_name(request, "MAX_SUM").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="until_cancelled", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([1], np.int32)),
                        pb_utils.Tensor("COUNT", np.array([20], np.int32)),
                        pb_utils.get_input_tensor_by_name(request, "IGNORE")])
            stream = call.exec(decoupled=True)
            total, cancelled, read = 0, False, 0
            for response in stream:
                if response.has_error():
                    cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                    break
                if not response.output_tensors():
                    continue
                read += 1
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                if total >= max_sum:
                    stream.cancel()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], np.bool_)),
                pb_utils.Tensor("READ", np.array([read], np.int32))]))
        return responses
