"""As Triton's repeat example, with each value as a response parameter "index": one response per
element of IN, sent from a thread after execute() returned."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            thread = threading.Thread(target=self.repeat, args=(request.get_response_sender(), values))
            thread.start()
            self.threads.append(thread)
        return None

    def repeat(self, sender, values):
        for value in values:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))],
                                                   parameters={"index": int(value)}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
