"""Every execute() raises a TritonModelException."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("this model always fails")
