"""A model that is not decoupled answering through its response sender, through a real daemon: over
HTTP and gRPC, answered during execute() or later from a thread while the instance serves the next
request, and batched beside requests answered the ordinary way."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.appliance.backends.python.test_response_sender import GATE, SENDER
from tests.models import copy_model
from tests.waiting import open_gate, wait_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sender")
    copy_model(repo, SENDER, config="batched")
    os.mkfifo(repo / "sender" / GATE)
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _inputs(module, mode: str, x: list[int]):
    tensors = [module.InferInput("MODE", [1, 1], "BYTES"), module.InferInput("X", [1, 2], "INT32")]
    tensors[0].set_data_from_numpy(np.array([[mode.encode()]], dtype=object))
    tensors[1].set_data_from_numpy(np.array([x], np.int32))
    return tensors


def test_answers_sent_during_execute_over_http_and_grpc(client, daemon):
    assert client.infer("sender", _inputs(httpclient, "before", [1, 2])).as_numpy("Y").tolist() == [[12, 22]]
    with grpcclient.InferenceServerClient(daemon.grpc_url) as grpc:
        result = grpc.infer("sender", _inputs(grpcclient, "then_final", [3, 4]))
    assert result.as_numpy("Y").tolist() == [[33, 43]]


def test_a_late_answer_leaves_the_instance_free_meanwhile(daemon, repository):
    done: dict[str, float] = {}

    def call(mode: str, x: list[int]) -> None:
        with httpclient.InferenceServerClient(daemon.url) as client:
            y = client.infer("sender", _inputs(httpclient, mode, x)).as_numpy("Y").tolist()
        done[mode] = time.monotonic()
        done[mode + "_y"] = y

    def executions() -> int:
        with httpclient.InferenceServerClient(daemon.url) as client:
            return client.get_inference_statistics("sender")["model_stats"][0]["execution_count"]

    before = executions()
    late = threading.Thread(target=call, args=("after", [5, 6]))
    late.start()
    # the late one's execute() has returned (its execution counted); its answer waits at the gate
    wait_until(lambda: executions() > before, what="the late request's execute() returned")
    call("return", [7, 8])
    open_gate(repository / "sender" / GATE)
    late.join(30)
    assert done["return_y"] == [[71, 81]] and done["after_y"] == [[54, 64]]
    assert done["return"] < done["after"]  # one instance: it served the second request meanwhile


def test_a_final_flag_before_any_response_fails_with_tritons_words(client):
    with pytest.raises(InferenceServerException, match="Non-decoupled model cannot send complete final before "
                                                       "sending a response"):
        client.infer("sender", _inputs(httpclient, "final_first", [1, 1]))
