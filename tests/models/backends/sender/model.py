"""The response sender of a model that is not decoupled. MODE says how each request is answered: "return"
(in the list execute returns), "before" (sent with the final flag during execute), "then_final" (sent,
then the final flag alone), "after" (from a thread once execute returned, when the test opens the gate
later.fifo in the model's directory), "final_first" (the final flag before any response), "twice" (two
responses during execute), "forgotten" (the sender taken, never used), "send_and_return" (sent, and
returned too). Y is X * 10 + a mark of the path taken."""

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _response(request, mark):
    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 10 + mark).astype(np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "later.fifo")

    def execute(self, requests):
        returned, later = [], []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0, 0].decode()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if mode == "return":
                returned.append(_response(request, 1))
                continue
            sender = request.get_response_sender()
            if mode == "before":
                sender.send(_response(request, 2), flags=final)
            elif mode == "then_final":
                sender.send(_response(request, 3))
                sender.send(flags=final)
            elif mode == "after":
                later.append((request, sender))
            elif mode == "final_first":
                sender.send(flags=final)
            elif mode == "twice":
                sender.send(_response(request, 5))
                sender.send(_response(request, 6))
            elif mode == "forgotten":  # the sender is taken, never used, and let go of with the request
                pass
            elif mode == "send_and_return":
                sender.send(_response(request, 7), flags=final)
                returned.append(_response(request, 8))
                continue
            returned.append(None)
        if later:
            threading.Thread(target=self._answer_later, args=(later,)).start()
        return None if all(r is None for r in returned) else returned

    def _answer_later(self, later):
        open(self.gate).close()  # well after execute() returned: the next batch may have run meanwhile
        for request, sender in later:
            sender.send(_response(request, 4), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
