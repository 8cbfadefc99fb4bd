"""A stateful model: answers each request of a sequence with the running sum, its correlation ID and flags."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            corrid = request.correlation_id()
            total = self.sums.get(corrid, 0) + x
            self.sums[corrid] = total
            if request.flags() & 2:
                del self.sums[corrid]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("CORRID", np.array([corrid], np.uint64)),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int32))]))
        return responses
