"""Polls request.is_cancelled() from inside execute() until it turns True (or 30 s pass), and notes in
seen.txt, beside its version directory, when it started and when it saw the cancellation; IN 0 answers
at once. Served with decoupled.pbtxt it polls both the request and its response sender, streaming as it
waits."""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen.txt")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def note(self, text):
        with open(self.seen, "a") as seen:
            seen.write(text + "\n")

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self.stream_until_cancelled(request)
            return None
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value.flat[0] == 0:  # answers at once
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                continue
            self.note(f"started {request.request_id()}")
            deadline = time.monotonic() + 30
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.02)
            self.note_end(request)
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "cancelled", pb_utils.TritonError.CANCELLED)))
        return responses

    def stream_until_cancelled(self, request):
        sender = request.get_response_sender()
        value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        self.note(f"started {request.request_id()}")
        deadline = time.monotonic() + 30
        while not (request.is_cancelled() and sender.is_cancelled()) and time.monotonic() < deadline:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            time.sleep(0.05)
        self.note_end(request)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def note_end(self, request):
        self.note(f"{'cancelled' if request.is_cancelled() else 'never cancelled'} {request.request_id()}")
