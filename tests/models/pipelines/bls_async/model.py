"""async def execute, two calls to the ONNX identity in flight at once; Y is their sum."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                                               inputs=[pb_utils.Tensor("IN_FP32", x * k)]) for k in (1, 10)]
            first, second = await asyncio.gather(*(c.async_exec() for c in calls))
            y = (pb_utils.get_output_tensor_by_name(first, "OUT_FP32").as_numpy()
                 + pb_utils.get_output_tensor_by_name(second, "OUT_FP32").as_numpy())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y), pb_utils.Tensor("ERR", np.array([[b""]] * len(x), dtype=object))]))
        return responses
