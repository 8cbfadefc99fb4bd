"""Hangs in execute(), once it wrote "hanging" in its model directory."""

import os
import threading


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "hanging")

    def execute(self, requests):
        open(self.marker, "w").close()
        threading.Event().wait()
