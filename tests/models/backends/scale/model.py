"""Module state and a relative import (factor.py, which a test may rewrite): two models with this same
layout must not share either. OUT is IN * FACTOR; a negative IN is an error response, 99 raises."""

import triton_python_backend_utils as pb_utils

from .factor import FACTOR

calls: list[int] = []


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        calls.append(len(requests))
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if data.flat[0] < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative", 3)))
            elif data.flat[0] == 99:
                raise ValueError("ninety-nine")
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * FACTOR)],
                                                            parameters={"calls": len(calls), "by": self.name}))
        return responses
