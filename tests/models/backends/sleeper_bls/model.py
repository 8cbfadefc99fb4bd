"""async execute() that reaches model 'sleeper' through an awaited streamed BLS call per request (Triton's
async_execute_decouple_bls)."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def forward(self, request):
        call = pb_utils.InferenceRequest(model_name="sleeper", requested_output_names=["OUT"],
                                         inputs=[pb_utils.get_input_tensor_by_name(request, "WAIT")])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self.forward(request) for request in requests))
        return None
