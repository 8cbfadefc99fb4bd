"""Python models that reschedule their requests (``request.set_release_flags(RESCHEDULE)``), as Triton's
iterative-sequence users write them: a token-by-token generator, a model that answers on its second
try, a BLS driver calling both, and the same rescheduling model under schedulers that cannot run a
request again."""

# PROMPT asks for that many tokens; each step (one execute() of a batch) makes one token per request
# and reschedules the request until it has them all. TOKEN counts 1..N; BATCH is how many requests the
# step's batch held (not counting padding rows). The state is kept per correlation ID (the scheduler gives
# each request its own).
TOKENS = """
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
"""

TOKENS_CONFIG = """
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
input [ { name: "PROMPT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { iterative_sequence: true }
"""

# Not decoupled: reschedules each request once (None in its place), answers it on its second run.
SECOND_TRY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = set()

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            if corrid not in self.seen:
                self.seen.add(corrid)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            self.seen.discard(corrid)
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b),
                                                         pb_utils.Tensor("DIFF", a - b)]))
        return responses
"""

SECOND_TRY_IO = """
backend: "python"
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
SECOND_TRY_CONFIG = SECOND_TRY_IO + "sequence_batching { iterative_sequence: true }\n"
SECOND_TRY_DYNAMIC = SECOND_TRY_IO + "max_batch_size: 4\ndynamic_batching { }\n"
SECOND_TRY_SEQUENCE = SECOND_TRY_IO + "sequence_batching { direct { } }\n"

# Returns a response for a request it rescheduled: Triton's error.
WRONG_RETURN = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""

WRONG_RETURN_CONFIG = SECOND_TRY_CONFIG

# BLS: streams the tokens of `tokens` (decoupled) and calls `second_try`; returns both.
BLS_DRIVER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            tokens = []
            call = pb_utils.InferenceRequest(model_name="tokens", requested_output_names=["TOKEN"],
                                             inputs=[pb_utils.Tensor("PROMPT", wanted.reshape(1, 1))])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "TOKEN")
                if out is not None:
                    tokens.append(int(out.as_numpy().reshape(-1)[0]))
            ones = np.ones(16, np.float32)
            summed = pb_utils.InferenceRequest(
                model_name="second_try", requested_output_names=["SUM"],
                inputs=[pb_utils.Tensor("A", ones), pb_utils.Tensor("B", ones * 2)]).exec()
            if summed.has_error():
                raise pb_utils.TritonModelException(summed.error().message())
            total = float(pb_utils.get_output_tensor_by_name(summed, "SUM").as_numpy().sum())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOKENS", np.array(tokens, np.int32)),
                pb_utils.Tensor("TOTAL", np.array([total], np.float32))]))
        return responses
"""

BLS_DRIVER_CONFIG = """
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKENS" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
