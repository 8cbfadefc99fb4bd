"""BLS: streams the tokens of ``tokens`` (decoupled) and calls ``second_try``; returns both."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            tokens = []
            call = pb_utils.InferenceRequest(model_name="tokens", requested_output_names=["TOKEN"],
                                             inputs=[pb_utils.Tensor("PROMPT", wanted.reshape(1, 1))])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "TOKEN")
                if out is not None:
                    tokens.append(int(out.as_numpy().reshape(-1)[0]))
            ones = np.ones(16, np.float32)
            summed = pb_utils.InferenceRequest(
                model_name="second_try", requested_output_names=["SUM"],
                inputs=[pb_utils.Tensor("A", ones), pb_utils.Tensor("B", ones * 2)]).exec()
            if summed.has_error():
                raise pb_utils.TritonModelException(summed.error().message())
            total = float(pb_utils.get_output_tensor_by_name(summed, "SUM").as_numpy().sum())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOKENS", np.array(tokens, np.int32)),
                pb_utils.Tensor("TOTAL", np.array([total], np.float32))]))
        return responses
