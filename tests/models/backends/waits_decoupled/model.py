"""As waits, decoupled: it polls both the request and its response sender, streaming as it waits."""

import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen.txt")

    def note(self, text):
        with open(self.seen, "a") as seen:
            seen.write(text + "\n")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.note(f"started {request.request_id()}")
            deadline = time.monotonic() + 30
            while not (request.is_cancelled() and sender.is_cancelled()) and time.monotonic() < deadline:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                time.sleep(0.05)
            self.note(f"{'cancelled' if request.is_cancelled() else 'never cancelled'} {request.request_id()}")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
