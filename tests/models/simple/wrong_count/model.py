"""Returns no response at all for any batch: the wrong number of responses."""

class TritonPythonModel:
    def execute(self, requests):
        return []
