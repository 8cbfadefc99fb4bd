"""Doubles its BF16 input in torch (both ways by DLPack); as_numpy() must refuse BF16 with Triton's words."""

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                tensor.as_numpy()
                raise RuntimeError("as_numpy() of a BF16 tensor must fail")
            except pb_utils.TritonModelException as exc:
                assert "tensor dtype is bf16 and cannot be converted to numpy" in str(exc).lower()
            value = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            assert value.dtype == torch.bfloat16
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(value * 2))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
