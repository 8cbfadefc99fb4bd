"""Waits for its request to be cancelled, then answers 1 if both the request and its sender say so."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.watch, args=(request,)).start()
        return None

    def watch(self, request):
        sender = request.get_response_sender()
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        state = 1 if request.is_cancelled() and sender.is_cancelled() else 0
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([state], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
