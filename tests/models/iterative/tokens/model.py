"""PROMPT asks for that many tokens; each step (one execute() of a batch) makes one token per request
and reschedules the request until it has them all. TOKEN counts 1..N; BATCH is how many requests the
step's batch held (not counting padding rows). The state is kept per correlation ID (the scheduler gives
each request its own)."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.made = {}

    def execute(self, requests):
        time.sleep(0.03)  # a step's work: requests arriving meanwhile join the next batch
        real = sum(1 for request in requests if request.correlation_id() != 0)
        for request in requests:
            corrid = request.correlation_id()
            if corrid == 0:  # an empty slot's padding row (Triton's null request): nothing to make
                continue
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.made[corrid] = 0
            wanted = int(pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0])
            self.made[corrid] += 1
            token = self.made[corrid]
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("TOKEN", np.array([[token]], np.int32)),
                pb_utils.Tensor("BATCH", np.array([[real]], np.int32))])
            sender = request.get_response_sender()
            if token >= wanted:
                del self.made[corrid]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
