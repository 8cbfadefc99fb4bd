"""y = 2x; appends one line per request executed (its instance, its shape, its first value) to
executions.log in its model directory."""

import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executions.log")
        self.name = args["model_instance_name"]

    def execute(self, requests):
        with open(self.log, "a") as log:
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                log.write(f"{self.name} {list(x.shape)} {x.ravel()[0]}\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]) for r in requests]
