"""Decoupled Python models (model_transaction_policy { decoupled: true }) for the streaming tests, written
as Triton's own decoupled examples are, and a repository holding them with an ONNX model beside."""

from __future__ import annotations

from pathlib import Path

from appliance.examples import build_example_repository
from tests.models import write_python_model

# One response per element of IN (OUT = the value, IDX = its index), sent from a thread after execute
# returns; a negative value is sent as an error response instead, and the stream goes on; the final
# flag comes alone at the end (so IN with no elements gives no response at all).
REPEAT = '''
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("this model must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), values))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values):
        for index, value in enumerate(values):
            if value < 0:
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
'''

REPEAT_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

# Sends a response every 10 ms until its request is cancelled, then appends the request's id to
# cancelled.txt in the model's directory (what the tests look for) and ends the stream.
ENDLESS = '''
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "cancelled.txt")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.tick, args=(request, request.get_response_sender()), daemon=True).start()
        return None

    def tick(self, request, sender):
        count = 0
        while not request.is_cancelled() and count < 6000:
            out = pb_utils.Tensor("OUT", np.array([count], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            count += 1
            time.sleep(0.01)
        if request.is_cancelled():
            with open(self.marker, "a") as marker:
                marker.write(request.request_id() + "\\n")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

ENDLESS_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# A text model in the shape LLM front ends expect of the generate extension: text_input in, one
# response per word of it out (text_output), sent from execute itself, then the final flag alone.
WORDS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            for word in text.split():
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

WORDS_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
'''

MODELS = {"repeat": (REPEAT, REPEAT_CONFIG), "endless": (ENDLESS, ENDLESS_CONFIG), "words": (WORDS, WORDS_CONFIG)}


def build_streaming_repository(root: Path) -> Path:
    """The example repository (``simple`` is an ONNX model that answers once) plus the decoupled models."""
    repo = build_example_repository(root)
    for name, (source, config) in MODELS.items():
        write_python_model(repo, name, source, config)
    return repo
