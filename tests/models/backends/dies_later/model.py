"""Sends one response, then exits with code 4 (the stream still open) once execute() returned, when the
test opens the gate (exit.fifo in the model's directory)."""

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "exit.fifo")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        threading.Thread(target=self._exit_later).start()
        return None

    def _exit_later(self):
        open(self.gate).close()
        os._exit(4)
