"""OUT = IN + 1; SEEN = (how many requests this execute() got, how many executions so far); IN[0] == -1
raises; each execute() first sleeps the config's parameter "sleep_seconds" (0 without it), so that
concurrent requests queue."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.seconds = float(parameters.get("sleep_seconds", {}).get("string_value", "0"))
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        time.sleep(self.seconds)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if data[0] == -1:
                raise ValueError("minus one")
            seen = np.asarray([len(requests), self.executions], np.int32)
            outputs = [pb_utils.Tensor("OUT", data + 1), pb_utils.Tensor("SEEN", seen)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
