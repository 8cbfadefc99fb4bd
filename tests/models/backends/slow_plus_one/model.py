"""Sleeps (in ms) as long as its first input says, returns its input + 1; -1 ends the process (code 5) once
the test opens the gate (exit.fifo in the model's directory)."""

import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "exit.fifo")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if data.flat[0] == -1:
                open(self.gate).close()
                os._exit(5)
            time.sleep(float(data.flat[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data + 1)]))
        return responses
