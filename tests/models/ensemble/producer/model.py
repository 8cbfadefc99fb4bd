"""Sends IN[0] responses as fast as its client lets it, writing how many it sent to progress.txt in its directory
after each one."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.progress = os.path.join(args["model_repository"], "progress.txt")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index in range(int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])):
                if request.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index], np.int32))]))
                with open(self.progress, "w") as progress:
                    progress.write(str(index + 1))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
