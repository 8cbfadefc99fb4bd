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
from tests.models import copy_model, read_config
from tests.waiting import open_gate, wait_until

# Each a decoupled model of tests/models/backends sharing this config: ``repeat_with_parameters`` (as
# Triton's repeat example, each value a response from a thread after execute() returned, with the value as
# the response parameter "index"), ``zero_responses`` (the final flag alone, then a second one; a negative
# IN an error response), ``waits_for_cancel``, ``returns_list`` (execute() returns a list), ``dies_later``
# (one response, then exits with code 4 once the test opens exit.fifo) and ``send_flags`` (sends the flags
# its IN names).
DECOUPLED_CONFIG = read_config("backends/returns_list")


def _request(values, sink, cancelled=lambda: False):
    return BackendRequest({"IN": np.array(values, np.int32)}, ["OUT"], sink=sink, cancelled=cancelled)


def test_responses_stream_from_threads_after_execute_returns(tmp_path):
    model = copy_model(tmp_path, "backends/repeat_with_parameters", "repeat")
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
    model = copy_model(tmp_path, "backends/zero_responses", "inline")
    with loaded(model, DECOUPLED_CONFIG) as backend:
        ok, bad = RecordingSink(), RecordingSink()
        batch = backend.run_requests([_request([1], ok), _request([-1], bad)])
        assert batch.results == [{}, {}]
        (only,) = ok.wait_final()
        assert only.final and only.outputs is None and only.error is None
        (failed,) = bad.wait_final()
        assert failed.final and "negative" in str(failed.error) and failed.error.status == 400


def test_cancellation_reaches_the_model(tmp_path):
    model = copy_model(tmp_path, "backends/waits_for_cancel", "cancel")
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
    model = copy_model(tmp_path, "backends/returns_list")
    # The batch fails as a whole, as when execute() raises, in Triton's words (qa L0_backend_python
    # decoupled_test's test_decoupled_return_response_error), which name the model instance.
    with loaded(model, DECOUPLED_CONFIG) as backend, pytest.raises(InferenceFailed) as failed:
        backend.run_requests([_request([1], RecordingSink())])
    assert ("Python model 'returns_list_0_0' is using the decoupled mode and the execute function must return "
            "None.") in str(failed.value)


def test_open_streams_fail_when_the_process_dies(tmp_path):
    model = copy_model(tmp_path, "backends/dies_later", "dies")
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
    model = copy_model(tmp_path, "backends/send_flags", "flags")
    with loaded(model, DECOUPLED_CONFIG) as backend:
        sink = RecordingSink()
        backend.run_requests([_request([flags], sink)])
        (answer,) = sink.wait_final()
        assert "Unsupported flag" in str(answer.error)
