"""Answers with what model 'other' (BLS) gives for its IN, and whether its request was cancelled as the
response parameter "cancelled"."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="other", requested_output_names=["OUT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            answer = call.exec()
            responses.append(pb_utils.InferenceResponse(answer.output_tensors(),
                                                        parameters={"cancelled": request.is_cancelled()}))
        return responses
