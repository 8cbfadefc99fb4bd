"""As the qa/L0_decoupled repeat_int32 (written here, nothing of NVIDIA's copied): one response per
element of IN, each after DELAY[i] milliseconds: OUT = IN[i], IDX = i, sent from a thread after execute
returns; then the final flag alone. WAIT changes nothing here. IN and DELAY of different lengths is an
error."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            sender = request.get_response_sender()
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
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
