"""Answers IN through model 'other' (BLS, in helper.py) for every request, with the thread it ran on as the
response parameter "thread": a tuning process, which serves no other model, cannot measure it."""

import threading

import triton_python_backend_utils as pb_utils

from .helper import ask_other


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            data = ask_other(request)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)],
                                                        parameters={"thread": threading.current_thread().name}))
        return responses
