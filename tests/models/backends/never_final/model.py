"""Sends one response and never its final flag; a thread notes in seen.txt when the request turns cancelled."""

import os
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen.txt")

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            threading.Thread(target=self.watch, args=(request,), daemon=True).start()
        return None

    def watch(self, request):
        deadline = time.monotonic() + 60
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(self.seen, "a") as seen:
            seen.write(f"{request.request_id()} {request.is_cancelled()}\n")
