"""Hangs in initialize(), once it wrote "hanging" in its model directory."""

import os
import threading


class TritonPythonModel:
    def initialize(self, args):
        open(os.path.join(args["model_repository"], "hanging"), "w").close()
        threading.Event().wait()

    def execute(self, requests):
        return []
