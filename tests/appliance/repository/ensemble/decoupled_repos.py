"""Ensembles with decoupled Python steps (and the steps that answer once around them), shaped as Triton's
qa/L0_decoupled ensembles are: a decoupled step whose every response flows on through the steps after it,
decoupled steps in a row, a decoupled ensemble inside another, a step that sends its responses until it is
cancelled, and steps that leave out one of their outputs."""

from __future__ import annotations

from pathlib import Path

from tests.appliance.repository.ensemble.repos import ensemble_config, step, write_ensemble
from tests.models import write_python_model
from tests.models.decoupled import ENDLESS, ENDLESS_CONFIG, REPEAT, REPEAT_CONFIG

I1 = [1]

# Y = X * X after sleeping X / 10 s, on two instances: a larger value that comes first finishes last, so
# the order of an ensemble's responses is its own doing, not the step's.
SLOW_SQUARE = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(max(int(x[0]), 0) / 10)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * x).astype(np.int32))]))
        return responses
'''

SLOW_SQUARE_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
'''

# As Triton's square_int32 example: X responses of value X, sent from execute itself, then the final flag.
FAN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

FAN_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# Declares A and B, answers with A alone (B is never produced).
PARTIAL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("A", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''

PARTIAL_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# OUT = A + B, or A + 100 when the optional B is not sent.
PICK = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", a + (b.as_numpy() if b else 100))]))
        return responses
'''

PICK_CONFIG = '''
backend: "python"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# One response per element of IN, each naming the sequence it belongs to (sequence 42, START on the first
# and END on the last), as a tokenizer feeding a stateful model does.
TOKENS = '''
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
'''

TOKENS_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# A stateful model: answers each request of a sequence with the running sum, its correlation ID and flags.
TALLY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            corrid = request.correlation_id()
            total = self.sums.get(corrid, 0) + x
            self.sums[corrid] = total
            if request.flags() & 2:
                del self.sums[corrid]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("CORRID", np.array([corrid], np.uint64)),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int32))]))
        return responses
'''

TALLY_CONFIG = '''
backend: "python"
max_batch_size: 0
sequence_batching { max_sequence_idle_microseconds: 10000000 }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }
]
'''

# Sends IN[0] responses as fast as its client lets it, writing how many it sent to progress.txt in its
# directory after each one.
PRODUCER = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.progress = os.path.join(args["model_repository"], "progress.txt")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index in range(int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])):
                if request.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([index], np.int32))]))
                with open(self.progress, "w") as progress:
                    progress.write(str(index + 1))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

PRODUCER_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

# Sleeps 0.3 s and reports when it ran ([start, end], time.time()), on two instances.
SPAN = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            start = time.time()
            time.sleep(0.3)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SPAN", np.array([start, time.time()], np.float64))]))
        return responses
'''

SPAN_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
'''

MODELS = {
    "repeat": (REPEAT, REPEAT_CONFIG), "slow_square": (SLOW_SQUARE, SLOW_SQUARE_CONFIG), "fan": (FAN, FAN_CONFIG),
    "endless": (ENDLESS, ENDLESS_CONFIG), "partial": (PARTIAL, PARTIAL_CONFIG), "pick": (PICK, PICK_CONFIG),
    "tokens": (TOKENS, TOKENS_CONFIG), "tally": (TALLY, TALLY_CONFIG), "producer": (PRODUCER, PRODUCER_CONFIG),
    "span": (SPAN, SPAN_CONFIG),
}

REPEATED = [("IN", "TYPE_INT32", [-1])]


def decoupled_repository(repo: Path) -> Path:
    """The models above and these ensembles (every tensor INT32 [1] unless said):

    - ``rsq``: repeat(IN [-1]) -> slow_square: one (SQ, IDX) per element of IN, decoupled
    - ``rfan``: repeat -> fan: a decoupled step after a decoupled step (n responses of n per element)
    - ``inner`` = repeat alone (OUT, IDX), and ``outer`` = inner -> fan: a decoupled ensemble as a step
    - ``endless_chain``: endless(IN [1]) -> pick (+100): responses until the request is cancelled
    - ``partial_chain``: partial(X) -> (A, B never produced) -> pick(A, B): not decoupled
    - ``partial_out``: partial alone, both A and B ensemble outputs
    - ``tally_chain``: tokens(IN [-1]) -> tally: each response a request of sequence 42
    - ``flood``: producer(IN) -> pick (+100): as many responses as IN says, as fast as they are read
    - ``limited``: span(X) with ``max_inflight_requests: 1``
    """
    for name, (source, config) in MODELS.items():
        write_python_model(repo, name, source, config)
    one = "TYPE_INT32"
    write_ensemble(repo, "rsq", ensemble_config(
        REPEATED, [("SQ", one, I1), ("IDX", "TYPE_UINT32", I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "r", "IDX": "IDX"}), step("slow_square", {"X": "r"}, {"Y": "SQ"})],
        max_batch_size=0))
    write_ensemble(repo, "rfan", ensemble_config(
        REPEATED, [("OUT", one, I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "r"}), step("fan", {"X": "r"}, {"OUT": "OUT"})], max_batch_size=0))
    write_ensemble(repo, "inner", ensemble_config(
        REPEATED, [("OUT", one, I1), ("IDX", "TYPE_UINT32", I1)],
        [step("repeat", {"IN": "IN"}, {"OUT": "OUT", "IDX": "IDX"})], max_batch_size=0))
    write_ensemble(repo, "outer", ensemble_config(
        REPEATED, [("OUT", one, I1)],
        [step("inner", {"IN": "IN"}, {"OUT": "r"}), step("fan", {"X": "r"}, {"OUT": "OUT"})], max_batch_size=0))
    write_ensemble(repo, "endless_chain", ensemble_config(
        [("IN", one, I1)], [("OUT", one, I1)],
        [step("endless", {"IN": "IN"}, {"OUT": "r"}), step("pick", {"A": "r"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "partial_chain", ensemble_config(
        [("X", one, I1)], [("OUT", one, I1)],
        [step("partial", {"X": "X"}, {"A": "a", "B": "b"}), step("pick", {"A": "a", "B": "b"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "partial_out", ensemble_config(
        [("X", one, I1)], [("A", one, I1), ("B", one, I1)],
        [step("partial", {"X": "X"}, {"A": "A", "B": "B"})], max_batch_size=0))
    write_ensemble(repo, "tally_chain", ensemble_config(
        REPEATED, [("SUM", one, I1), ("CORRID", "TYPE_UINT64", I1), ("FLAGS", one, I1)],
        [step("tokens", {"IN": "IN"}, {"OUT": "t"}),
         step("tally", {"X": "t"}, {"SUM": "SUM", "CORRID": "CORRID", "FLAGS": "FLAGS"})], max_batch_size=0))
    write_ensemble(repo, "flood", ensemble_config(
        [("IN", one, I1)], [("OUT", one, I1)],
        [step("producer", {"IN": "IN"}, {"OUT": "r"}), step("pick", {"A": "r"}, {"OUT": "OUT"})],
        max_batch_size=0))
    write_ensemble(repo, "limited", ensemble_config(
        [("X", one, I1)], [("SPAN", "TYPE_FP64", [2])], [step("span", {"X": "X"}, {"SPAN": "SPAN"})],
        max_batch_size=0).replace("ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1"))
    return repo
