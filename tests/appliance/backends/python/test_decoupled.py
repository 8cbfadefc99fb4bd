"""Decoupled Python models at the backend level: responses stream to each request's sink, from any
thread, during or after execute(); cancellation reaches request.is_cancelled()."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from appliance.backends.base import BackendRequest
from appliance.core.errors import InferenceFailed
from tests.appliance.backends.python.harness import RecordingSink, loaded
from tests.models import write_python_model
from tests.waiting import open_gate, wait_until

DECOUPLED_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# As Triton's repeat example (tests.models.decoupled's ``repeat``, with each value as a response parameter
# instead of its index as a tensor): one response per element, sent from a thread after execute() returned.
REPEAT = """
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
"""

# Sends while execute() runs: nothing, then the final flag alone (zero responses).
INLINE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if values[0] < 0:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative", pb_utils.TritonError.INVALID_ARG)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_info(f"second final refused: {exc}")
        return None
"""

# Waits for its request to be cancelled, then says so.
WAITS_FOR_CANCEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.watch, args=(request,)).start()
        return None

    def watch(self, request):
        sender = request.get_response_sender()
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        state = 1 if request.is_cancelled() and sender.is_cancelled() else 0
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([state], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

RETURNS_LIST = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""

# Sends one response, then exits (the stream still open) once execute() returned, when the test opens the gate.
DIES_LATER = """
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "exit.fifo")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        threading.Thread(target=lambda: (open(self.gate).close(), os._exit(4))).start()
        return None
"""


def _request(values, sink, cancelled=lambda: False):
    return BackendRequest({"IN": np.array(values, np.int32)}, ["OUT"], sink=sink, cancelled=cancelled)


def test_responses_stream_from_threads_after_execute_returns(tmp_path):
    model = write_python_model(tmp_path, "repeat", REPEAT, DECOUPLED_CONFIG)
    with loaded(model, DECOUPLED_CONFIG) as backend:
        sinks = [RecordingSink(), RecordingSink()]
        batch = backend.run_requests([_request([4, 5, 6], sinks[0]), _request([7], sinks[1])])
        assert batch.results == [{}, {}]  # ignored for streaming requests
        first = sinks[0].wait_final()
        assert [s.outputs["OUT"].tolist() for s in first[:-1]] == [[4], [5], [6]]
        assert [s.parameters for s in first[:-1]] == [{"index": 4}, {"index": 5}, {"index": 6}]
        assert first[-1].final and first[-1].outputs is None and not any(s.final for s in first[:-1])
        assert [s.outputs["OUT"].tolist() for s in sinks[1].wait_final()[:-1]] == [[7]]
        # The input arena is reused by the next batch: the threads of the first must not see it.
        third = RecordingSink()
        backend.run_requests([_request(list(range(50)), third)])
        assert [s.outputs["OUT"][0] for s in third.wait_final()[:-1]] == list(range(50))


def test_zero_responses_errors_and_a_second_final(tmp_path):
    model = write_python_model(tmp_path, "inline", INLINE, DECOUPLED_CONFIG)
    with loaded(model, DECOUPLED_CONFIG) as backend:
        ok, bad = RecordingSink(), RecordingSink()
        batch = backend.run_requests([_request([1], ok), _request([-1], bad)])
        assert batch.results == [{}, {}]
        (only,) = ok.wait_final()
        assert only.final and only.outputs is None and only.error is None
        (failed,) = bad.wait_final()
        assert failed.final and "negative" in str(failed.error) and failed.error.status == 400


def test_cancellation_reaches_the_model(tmp_path):
    model = write_python_model(tmp_path, "cancel", WAITS_FOR_CANCEL, DECOUPLED_CONFIG)
    with loaded(model, DECOUPLED_CONFIG) as backend:
        flag = threading.Event()
        sink = RecordingSink()
        backend.run_requests([_request([1], sink, cancelled=flag.is_set)])
        with pytest.raises(AssertionError, match="timed out"):  # for 0.3 s: still waiting, not cancelled yet
            wait_until(lambda: sink.sent, timeout=0.3, what="an answer before the cancellation")
        flag.set()
        (answer,) = sink.wait_final()
        assert answer.outputs["OUT"].tolist() == [1]


def test_a_decoupled_execute_must_return_none(tmp_path):
    model = write_python_model(tmp_path, "returns_list", RETURNS_LIST, DECOUPLED_CONFIG)
    # The batch fails as a whole, as when execute() raises, in Triton's words (qa L0_backend_python
    # decoupled_test's test_decoupled_return_response_error), which name the model instance.
    with loaded(model, DECOUPLED_CONFIG) as backend, pytest.raises(InferenceFailed) as failed:
        backend.run_requests([_request([1], RecordingSink())])
    assert ("Python model 'returns_list_0_0' is using the decoupled mode and the execute function must return "
            "None.") in str(failed.value)


def test_open_streams_fail_when_the_process_dies(tmp_path):
    model = write_python_model(tmp_path, "dies", DIES_LATER, DECOUPLED_CONFIG)
    gate = tmp_path / "dies" / "exit.fifo"
    os.mkfifo(gate)
    with loaded(model, DECOUPLED_CONFIG) as backend:
        sink = RecordingSink()
        assert backend.run_requests([_request([1], sink)]).results == [{}]
        open_gate(gate)  # the process exits, with the stream still open
        sent = sink.wait_final()
        assert sent[0].outputs["OUT"].tolist() == [1]
        assert sent[-1].final and "exited with code 4" in str(sent[-1].error)
        # The next request gets a new process.
        again = RecordingSink()
        backend.run_requests([_request([2], again)])
        open_gate(gate)
        assert again.wait_final()[0].outputs["OUT"].tolist() == [1]


@pytest.mark.parametrize("flags", [2, 3])
def test_unsupported_send_flags_are_refused(tmp_path, flags):
    source = f"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                sender.send(flags={flags})
            except pb_utils.TritonModelException as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
    model = write_python_model(tmp_path, "flags", source, DECOUPLED_CONFIG)
    with loaded(model, DECOUPLED_CONFIG) as backend:
        sink = RecordingSink()
        backend.run_requests([_request([1], sink)])
        (answer,) = sink.wait_final()
        assert "Unsupported flag" in str(answer.error)
