"""Each INPUTn comes back as OUTPUTn, with the model process's pid as a response parameter
(in_process.pbtxt pins it to the in-process plan)."""

import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(t.name().replace("INPUT", "OUTPUT"), t.as_numpy())
                                            for t in request.inputs()], parameters={"pid": os.getpid()})
                for request in requests]
