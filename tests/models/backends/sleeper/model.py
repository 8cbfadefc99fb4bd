"""async execute() that sleeps WAIT seconds and answers once with the final flag (Triton's
async_execute_decouple)."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT").as_numpy().flat[0]) for r in requests]
        await asyncio.gather(*(asyncio.sleep(wait) for wait in waits))
        for request, wait in zip(requests, waits):
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([wait], np.float32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
