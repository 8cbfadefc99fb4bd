"""Its process exits with code 7 in initialize()."""

import os


class TritonPythonModel:
    def initialize(self, args):
        os._exit(7)

    def execute(self, requests):
        return []
