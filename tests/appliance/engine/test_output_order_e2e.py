"""The order of a response's outputs, as Triton gives it: a request that names no outputs gets every one
the model made in the order the model made them (NVIDIA's decoupled repeat example sends IDX then OUT,
its config lists OUT then IDX); a request that names them gets them in its own order."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import copy_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("order")
    copy_model(repo, "engine/reversed")
    copy_model(repo, "engine/repeat_idx_first", "repeat")
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _http_input() -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([4, 5, 6], np.int32))
    return [tensor]


def test_no_outputs_named_the_models_order_over_http(client):
    outputs = client.infer("reversed", _http_input()).get_response()["outputs"]
    assert [o["name"] for o in outputs] == ["IDX", "OUT"]


def test_outputs_named_the_requests_order_over_http(client):
    asked = [httpclient.InferRequestedOutput("OUT"), httpclient.InferRequestedOutput("IDX")]
    outputs = client.infer("reversed", _http_input(), outputs=asked).get_response()["outputs"]
    assert [o["name"] for o in outputs] == ["OUT", "IDX"]


def test_a_decoupled_models_responses_keep_its_order_over_a_grpc_stream(daemon):
    answers: queue.Queue = queue.Queue()
    tensor = grpcclient.InferInput("IN", [2], "INT32")
    tensor.set_data_from_numpy(np.array([8, 9], np.int32))
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("repeat", [tensor])
        received = [answers.get(timeout=30) for _ in range(2)]
        client.stop_stream()
    for (result, error), value in zip(received, (8, 9), strict=True):
        assert error is None
        assert [o.name for o in result.get_response().outputs] == ["IDX", "OUT"]
        assert result.as_numpy("OUT").tolist() == [value]
