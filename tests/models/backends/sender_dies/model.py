"""Exits (code 3) once its execute() returned, when the test opens the gate (later.fifo in the model's
directory)."""

import os
import threading


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "later.fifo")

    def execute(self, requests):
        # The senders are kept (by the thread) to answer later: a request let go of would be answered now.
        senders = [request.get_response_sender() for request in requests]
        threading.Thread(target=self._exit_later, args=(senders,)).start()
        return None

    def _exit_later(self, senders):
        open(self.gate).close()
        os._exit(3)
