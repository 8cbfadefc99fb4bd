"""Calls the ONNX identity with exec(); a request whose first value is negative also calls a model that
does not exist and returns the error text it got."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                inputs=[pb_utils.Tensor("IN_FP32", x)])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "OUT_FP32").as_numpy() * 2
            err = b""
            if x[0, 0] < 0:
                missing = pb_utils.InferenceRequest(
                    model_name="nope", requested_output_names=["OUT_FP32"],
                    inputs=[pb_utils.Tensor("IN_FP32", x)]).exec()
                err = f"{missing.has_error()}|{missing.error().code()}|{missing.error().message()}".encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y.astype(np.float32)),
                pb_utils.Tensor("ERR", np.array([[err]] * len(x), dtype=object))]))
        return responses
