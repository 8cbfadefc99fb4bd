"""exec(decoupled=True) on ``repeat`` (tests/models/decoupled/repeat) and on the identity (a stream of
one); async too."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            total, count = 0, 0
            call = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                             inputs=[pb_utils.Tensor("IN", values)])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                    count += 1
            for response in await call.async_exec(decoupled=True):
                if response.output_tensors():
                    count += 1
            single = pb_utils.InferenceRequest(
                model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                inputs=[pb_utils.Tensor("IN_FP32", np.ones((1, 4), np.float32))]).exec(decoupled=True)
            count += 100 * len([r for r in single if r.output_tensors()])
            plain = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                              inputs=[pb_utils.Tensor("IN", values)]).exec()
            assert plain.has_error() and "decoupled=True" in plain.error().message(), plain.error()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.int32)),
                                                         pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
