"""Fails to load with a long, many-line reason (as OpenVINO's conversion errors are): the dashboard's models
table shows its first line, the rest on demand."""


class TritonPythonModel:
    def initialize(self, args):
        details = "".join(f"\n  detail line {i} of the converter" for i in range(20))
        raise RuntimeError("the converter refused this model" + details)
