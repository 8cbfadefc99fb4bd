"""Loads the model "tripler" from files (tripler.onnx beside model.py), in the way CASE names; RESULT is
"ok" or the error's text."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

CONFIG = json.dumps({"backend": "onnxruntime", "max_batch_size": 8,
                     "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [8]}],
                     "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [8]}]})


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(__file__), "tripler.onnx"), "rb") as handle:
            self.onnx = handle.read()

    def execute(self, requests):
        responses = []
        for request in requests:
            case = pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0].decode()
            files = {
                "good": {"file:1/model.onnx": self.onnx},
                "escape": {"file:../escape/model.onnx": self.onnx},
                "absolute": {"file:/tmp/model.onnx": self.onnx},
                "no_version": {"file:model.onnx": self.onnx},
                "large": {"file:1/model.onnx": self.onnx, "file:1/padding.bin": b"0" * 4096},
            }.get(case, {})
            try:
                if case == "no_config":
                    pb_utils.load_model("tripler", files={"file:1/model.onnx": self.onnx})
                else:
                    pb_utils.load_model("tripler", config=CONFIG, files=files)
                result = "ok"
            except pb_utils.TritonModelException as exc:
                result = str(exc)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=object))]))
        return responses
