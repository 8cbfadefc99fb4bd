"""initialize() raises."""

class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights found")

    def execute(self, requests):
        return []
