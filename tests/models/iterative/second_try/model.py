"""Not decoupled: reschedules each request once (None in its place), answers it on its second run.
config.pbtxt is the iterative sequence; dynamic.pbtxt and sequence.pbtxt are schedulers that cannot run a
request again."""

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
