"""One response per element of IN (OUT = the value, IDX = its index), sent from a thread after execute
returns; a negative value is sent as an error response instead, and the stream goes on; the final
flag comes alone at the end (so IN with no elements gives no response at all).

Served with repeat_int32.pbtxt it is the qa/L0_decoupled repeat_int32 (written here, nothing of NVIDIA's
copied): each response after DELAY[i] milliseconds, any value repeated as it is (WAIT changes nothing);
IN and DELAY of different lengths is an error."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("this model must be decoupled")
        self.delayed = any(tensor["name"] == "DELAY" for tensor in config["input"])
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            delays = np.zeros(values.shape, np.uint32)
            if self.delayed:
                delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            if values.shape != delays.shape:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"expected IN and DELAY shape to match, got {list(values.shape)} and {list(delays.shape)}")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            thread = threading.Thread(target=self.respond, args=(sender, values, delays))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values, delays):
        for index, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000)
            if value < 0 and not self.delayed:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"negative value at {index}")))
                continue
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
