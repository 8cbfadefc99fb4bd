"""Sends a response every 10 ms until its request is cancelled, then appends the request's id to
cancelled.txt in the model's directory (what the tests look for) and ends the stream."""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "cancelled.txt")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.tick, args=(request, request.get_response_sender()), daemon=True).start()
        return None

    def tick(self, request, sender):
        count = 0
        while not request.is_cancelled() and count < 6000:
            out = pb_utils.Tensor("OUT", np.array([count], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            count += 1
            time.sleep(0.01)
        if request.is_cancelled():
            with open(self.marker, "a") as marker:
                marker.write(request.request_id() + "\n")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
