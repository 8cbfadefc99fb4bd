"""y = x + 1, holding ballast_mib MiB (the config's parameter; none: 8 bytes) of touched memory from
initialize: with the interpreter, a hog (config.pbtxt, 160 MiB) holds about 200 MiB; light.pbtxt holds none,
huge.pbtxt holds none but declares 2048 MiB (memory_mib)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        mib = int(parameters.get("ballast_mib", {}).get("string_value", "0"))
        self.ballast = np.ones(max(1, mib * 1024 * 1024 // 8))  # touched: resident

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                .as_numpy() + self.ballast[:1].astype(np.float32))]) for r in requests]
