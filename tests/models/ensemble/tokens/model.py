"""One response per element of IN, each naming the sequence it belongs to (sequence 42, START on the first and
END on the last), as a tokenizer feeding a stateful model does."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([value], np.int32))],
                    parameters={"sequence_id": 42, "sequence_start": index == 0,
                                "sequence_end": index == len(values) - 1}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
