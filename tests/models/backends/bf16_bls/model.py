"""BLS: hands its BF16 input (through torch) to model 'double', adds the input to the answer: 3x."""

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0"))
            call = pb_utils.InferenceRequest(
                model_name="double", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor.from_dlpack("INPUT0", x.clone())])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            doubled = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            assert doubled.triton_dtype() == 14  # BF16
            total = torch.from_dlpack(doubled) + x
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", total)]))
        return responses
