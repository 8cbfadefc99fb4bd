"""The response sender of a model that is not decoupled (Triton's rules): one response, with the final
flag or followed by it, sent during execute() or later from another thread, execute() returning None (or
None in that request's place); what breaks the rules fails with Triton's words."""

from __future__ import annotations

import os
from concurrent.futures import Future

import numpy as np
import pytest

from appliance.backends.base import BackendRequest
from tests.appliance.backends.python.harness import answer_y, loaded
from tests.models import copy_model, read_config
from tests.waiting import open_gate

SENDER = "backends/sender"
"""Answers each request as its MODE says (see its model.py); ``later.fifo`` in its model directory is the
gate its late answers wait at (``open_gate``). Y is X * 10 + a mark of the path taken."""
CONFIG = read_config(SENDER)
GATE = "later.fifo"


def _request(mode: str, x: list[int]) -> BackendRequest:
    return BackendRequest({"MODE": np.array([[mode.encode()]], dtype=object), "X": np.array([x], np.int32)},
                          ["Y"])


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """The gate the model's late answers wait at."""
    return tmp_path_factory.mktemp("sender") / "sender" / GATE


@pytest.fixture(scope="module")
def backend(gate):
    model = copy_model(gate.parent.parent, SENDER)
    os.mkfifo(gate)
    with loaded(model, CONFIG) as backend:
        yield backend


def test_a_response_sent_during_execute_is_theanswer_y(backend):
    before, then_final = backend.run_requests([_request("before", [1, 2]), _request("then_final", [3, 4])]).results
    assert answer_y(before) == [[12, 22]]
    assert answer_y(then_final) == [[33, 43]]


def test_a_response_sent_after_execute_returned_comes_later(backend, gate):
    (late,) = backend.run_requests([_request("after", [5, 6])]).results
    assert isinstance(late, Future) and not late.done()
    # The instance is free meanwhile: another batch runs, and its inputs overwrite the arena the late
    # request's inputs were in.
    (now,) = backend.run_requests([_request("return", [7, 8])]).results
    assert answer_y(now) == [[71, 81]]
    open_gate(gate)
    assert answer_y(late) == [[54, 64]]


def test_one_batch_answers_each_request_its_own_way(backend, gate):
    results = backend.run_requests([_request("return", [1, 1]), _request("before", [2, 2]),
                                    _request("after", [3, 3])]).results
    open_gate(gate)
    assert [answer_y(r) for r in results] == [[[11, 11]], [[22, 22]], [[34, 34]]]


def test_a_final_flag_before_any_response_fails_with_tritons_words(backend):
    # execute() raised and no request was answered: the batch fails as a whole (Triton's statistics).
    with pytest.raises(Exception, match="Non-decoupled model cannot send complete final before sending a response"):
        backend.run_requests([_request("final_first", [1, 1])])


def test_the_first_response_counts_when_a_second_is_refused(backend):
    # Triton: the second send raises in the model, which fails execute(); the first response has reached
    # the client already, so that is the answer.
    (result,) = backend.run_requests([_request("twice", [1, 2])]).results
    assert answer_y(result) == [[15, 25]]


def test_a_response_returned_after_one_was_sent_is_refused_but_the_sent_one_stands(backend):
    sent, other = backend.run_requests([_request("send_and_return", [1, 2]), _request("return", [3, 4])]).results
    assert answer_y(sent) == [[17, 27]]
    # execute() failed (Triton's words) for the request that had no answer yet.
    with pytest.raises(Exception, match="Non-decoupled model cannot send more than one response"):
        answer_y(other)


def test_a_request_let_go_of_unanswered_gets_tritons_error_and_the_model_serves_on(backend):
    # Triton deletes the response factory then and the client waits for ever; here it gets the error
    # Triton's stub gave for execute() returning None, once the request can no longer be answered.
    (forgotten,) = backend.run_requests([_request("forgotten", [1, 2])]).results
    with pytest.raises(Exception, match=r"message: Expected a list in the execute return, found type "
                                        r"'<class 'NoneType'>'\.") as info:
        answer_y(forgotten)
    assert info.value.status == 500
    (now,) = backend.run_requests([_request("return", [3, 4])]).results
    assert answer_y(now) == [[31, 41]]


# Exits once its execute() returned, when the test opens the gate.
DIES = "backends/sender_dies"


def test_a_late_answer_fails_when_the_process_dies_first(tmp_path):
    model = copy_model(tmp_path, DIES, "dies")
    os.mkfifo(tmp_path / "dies" / GATE)
    with loaded(model, CONFIG) as backend:
        (late,) = backend.run_requests([_request("after", [1, 1])]).results
        assert isinstance(late, Future)
        open_gate(tmp_path / "dies" / GATE)
        with pytest.raises(Exception, match="exited with code 3"):
            answer_y(late)
