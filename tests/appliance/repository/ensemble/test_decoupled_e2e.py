"""Decoupled ensembles against a daemon, with tritonclient and plain HTTP: gRPC ModelStreamInfer and
generate_stream carry every response of a decoupled Python step through the step after it, with Triton's
sequence and final-response parameters; an error ends its request in the stream; a cancelled stream or a
disconnected HTTP client cancels the decoupled step; the unary endpoints refuse the ensemble with
Triton's words; an ensemble step that leaves out an output answers with what was produced."""

from __future__ import annotations

import http.client
import json
import queue
import socket

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.appliance.repository.ensemble.decoupled_repos import decoupled_repository
from tests.http_util import call
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return decoupled_repository(tmp_path_factory.mktemp("decoupled_e2e") / "repo")


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, model_control_mode="explicit",
                             load_models=("rsq", "endless_chain", "partial_out"))


@pytest.fixture
def client(daemon):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        yield client


def _ints(module, name: str, values: list[int]):
    tensor = module.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


def _params(result) -> dict:
    parameters = result.get_response().parameters
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in parameters.items()}


def _until_final(answers: queue.Queue) -> list:
    got = []
    while True:
        result, error = answers.get(timeout=60)
        got.append((result, error))
        if error is not None or _params(result)["triton_final_response"]:
            return got


def test_model_stream_infer_streams_each_response_through_the_next_step_in_order(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("rsq", [_ints(grpcclient, "IN", [3, 1, 2])], request_id="seven",
                                  sequence_id=7, sequence_start=True, enable_empty_final_response=True)
        got = _until_final(answers)
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    with_outputs = [result for result, _ in got if result.get_response().outputs]
    assert [int(r.as_numpy("SQ")[0]) for r in with_outputs] == [9, 1, 4]
    assert [int(r.as_numpy("IDX")[0]) for r in with_outputs] == [0, 1, 2]
    assert all(r.get_response().id == "seven" for r, _ in got)
    assert [_params(r) for r in with_outputs[:2]] == [
        {"sequence_id": 7, "sequence_start": True, "sequence_end": False, "triton_final_response": False}] * 2
    assert [_params(r)["triton_final_response"] for r, _ in got].count(True) == 1


def test_an_error_response_ends_its_request_in_the_stream_and_the_stream_goes_on(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("rsq", [_ints(grpcclient, "IN", [1, -1, 2])], request_id="bad")
        failed = _until_final(answers)
        client.async_stream_infer("rsq", [_ints(grpcclient, "IN", [4])], request_id="good",
                                  enable_empty_final_response=True)
        served = _until_final(answers)
    finally:
        client.stop_stream()
    assert "in ensemble 'rsq', negative value at 1" in str(failed[-1][1])
    assert [int(r.as_numpy("SQ")[0]) for r, _ in served if r.get_response().outputs] == [16]


def test_cancelling_the_stream_cancels_the_decoupled_step(client, repository):
    marker = repository / "endless" / "cancelled.txt"
    gone = "gone"
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("endless_chain", [_ints(grpcclient, "IN", [1])], request_id=gone)
    got = [answers.get(timeout=60) for _ in range(3)]
    client.stop_stream(cancel_requests=True)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [100, 101, 102]
    # the step's model saw request.is_cancelled()
    wait_until(lambda: marker.exists() and gone in marker.read_text(), timeout=30, interval=0.05,
               what=f"the step's model noting {gone} cancelled")


def _events(port: int, path: str, body: dict) -> tuple[int, list[dict]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        assert response.getheader("Content-Type", "").startswith("text/event-stream"), text
    finally:
        connection.close()
    return response.status, [json.loads(chunk[len("data: "):]) for chunk in text.split("\n\n") if chunk]


def test_generate_stream_sends_each_response_as_an_event_with_triton_parameters(daemon):
    status, events = _events(daemon.port, "/v2/models/rsq/generate_stream", {"IN": [3, 4]})
    assert status == 200
    assert events == [
        {"IDX": 0, "SQ": 9, "model_name": "rsq", "model_version": "1", "sequence_id": 0, "sequence_start": False,
         "sequence_end": False},
        {"IDX": 1, "SQ": 16, "model_name": "rsq", "model_version": "1", "sequence_id": 0, "sequence_start": False,
         "sequence_end": False},
    ]
    _, events = _events(daemon.port, "/v2/models/rsq/generate_stream", {"IN": [2, -3]})
    assert events[-1] == {"error": "in ensemble 'rsq', negative value at 1"}


def test_a_client_that_disconnects_cancels_the_decoupled_step(daemon, repository):
    marker = repository / "endless" / "cancelled.txt"
    before = call(daemon.port, "GET", "/v2/models/endless_chain/stats")[2]["model_stats"][0]
    body = json.dumps({"id": "gone-http", "IN": 1}).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/endless_chain/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                     + body)
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(65536)
    wait_until(lambda: marker.exists() and "gone-http" in marker.read_text(), timeout=30, interval=0.05,
               what="the step's model noting gone-http cancelled")
    fail = before["inference_stats"]["fail"]["count"]
    wait_until(lambda: call(daemon.port, "GET", "/v2/models/endless_chain/stats")[2]["model_stats"][0]
               ["inference_stats"]["fail"]["count"] != fail, timeout=30, interval=0.05, what="the failure counted")
    stats = call(daemon.port, "GET", "/v2/models/endless_chain/stats")[2]["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == fail + 1  # counted once, as cancelled


def test_the_unary_endpoints_refuse_a_decoupled_ensemble_as_triton_does(daemon, client):
    assert call(daemon.port, "GET", "/v2/models/rsq/config")[2]["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        client.infer("rsq", [_ints(grpcclient, "IN", [1])])
    with httpclient.InferenceServerClient(daemon.url) as http_client, pytest.raises(
            InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        http_client.infer("rsq", [_ints(httpclient, "IN", [1])])


def test_an_output_no_step_produced_is_left_out_of_the_response(daemon, client):
    status, _, body = call(daemon.port, "POST", "/v2/models/partial_out/infer",
                           {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [3]}]})
    assert status == 200, body
    assert body["outputs"] == [{"name": "A", "datatype": "INT32", "shape": [1], "data": [3]}]
    assert body["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    result = client.infer("partial_out", [_ints(grpcclient, "X", [3])])
    assert [o.name for o in result.get_response().outputs] == ["A"] and result.as_numpy("B") is None
    status, _, body = call(daemon.port, "POST", "/v2/models/partial_out/infer",
                           {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [3]}],
                            "outputs": [{"name": "B"}]})
    assert (status, body["outputs"], "parameters" in body) == (200, [], False)
