"""OUT = IN, with IDX (7) made before OUT: the reverse of its config's order."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([7], np.uint32)),
                                                         pb_utils.Tensor("OUT", values)]))
        return responses
