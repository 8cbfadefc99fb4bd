"""Triton's generate extension against a daemon: generate and generate_stream (server-sent events) on a
decoupled Python model and on an ONNX model, the 400 of /infer on a decoupled model, and a client that
disconnects cancelling its request."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from tests.http_util import call
from tests.models.decoupled import build_streaming_repository
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_streaming_repository(tmp_path_factory.mktemp("generate") / "repo")


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, model_control_mode="explicit",
                             load_models=("simple", "repeat", "endless", "words"))


def _events(port: int, path: str, body: dict) -> tuple[int, str, list[dict]]:
    """POST ``body`` and parse the server-sent events of the answer: (status, content type, documents)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        content_type = response.getheader("Content-Type", "")
    finally:
        connection.close()
    if not content_type.startswith("text/event-stream"):
        return response.status, content_type, [json.loads(text)]
    assert text.endswith("\n\n") or text == ""
    events = [chunk for chunk in text.split("\n\n") if chunk]
    assert all(event.startswith("data: ") for event in events), text
    return response.status, content_type, [json.loads(event[len("data: "):]) for event in events]


def test_generate_stream_sends_each_response_as_an_event(daemon):
    status, content_type, events = _events(daemon.port, "/v2/models/words/generate_stream",
                                           {"id": "7", "text_input": "the quick brown fox"})
    assert status == 200 and content_type == "text/event-stream; charset=utf-8"
    assert [e["text_output"] for e in events] == ["the", "quick", "brown", "fox"]
    assert all(e["id"] == "7" and e["model_name"] == "words" and e["model_version"] == "1" for e in events)


def test_generate_returns_the_one_response_of_a_decoupled_model(daemon):
    status, _, body = call(daemon.port, "POST", "/v2/models/words/versions/1/generate", {"text_input": "hello"})
    assert status == 200 and body == {"model_name": "words", "model_version": "1", "text_output": "hello"}


def test_generate_refuses_a_model_that_sends_several_responses(daemon):
    status, _, body = call(daemon.port, "POST", "/v2/models/words/generate", {"text_input": "two words"})
    assert status == 400 and "generate expects model to produce exactly 1 response" in body["error"]
    assert "use generate stream" in body["error"]
    status, _, body = call(daemon.port, "POST", "/v2/models/repeat/generate", {"IN": []})  # none at all
    assert status == 400 and "exactly 1 response" in body["error"]


def test_errors_in_the_stream_are_error_events_and_the_stream_goes_on(daemon):
    status, _, events = _events(daemon.port, "/v2/models/repeat/generate_stream", {"IN": [4, -1, 6]})
    assert status == 200
    assert events == [{"IDX": 0, "OUT": 4, "model_name": "repeat", "model_version": "1"},
                      {"error": "negative value at 1"},
                      {"IDX": 2, "OUT": 6, "model_name": "repeat", "model_version": "1"}]


def test_no_response_is_an_empty_event_stream(daemon):
    status, content_type, events = _events(daemon.port, "/v2/models/repeat/generate_stream", {"IN": []})
    assert status == 200 and content_type.startswith("text/event-stream") and events == []


def test_a_model_that_answers_once_works_with_both(daemon):
    body = {"INPUT0": list(range(16)), "INPUT1": [1] * 16, "parameters": {"note": "x"}}
    status, _, answer = call(daemon.port, "POST", "/v2/models/simple/generate", body)
    assert status == 200
    assert answer == {"model_name": "simple", "model_version": "1", "OUTPUT0": [v + 1 for v in range(16)],
                      "OUTPUT1": [v - 1 for v in range(16)]}
    status, _, events = _events(daemon.port, "/v2/models/simple/generate_stream", body)
    assert status == 200 and events == [answer]


@pytest.mark.parametrize("path, body, status, words", [
    ("/v2/models/nope/generate", {}, 404, "nope"),
    ("/v2/models/simple/generate", {"INPUT0": [1, 2, 3], "INPUT1": [1] * 16}, 400,
     "can not convert input 'INPUT0' to tensor with proper shape"),
    ("/v2/models/simple/generate_stream", {"INPUT1": [1] * 16}, 400, "missing required input(s) ['INPUT0']"),
    ("/v2/models/words/generate_stream", {"text_input": "x", "p": [1]}, 400, "parameter 'p' has invalid type"),
])
def test_requests_that_fail_before_inference_are_json_errors(daemon, path, body, status, words):
    got, headers, answer = call(daemon.port, "POST", path, body)
    assert got == status and headers["Content-Type"].startswith("application/json") and words in answer["error"]


def test_infer_on_a_decoupled_model_is_a_400_that_says_what_to_use(daemon):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
    status, _, answer = call(daemon.port, "POST", "/v2/models/repeat/infer", body)
    assert status == 400
    assert "HTTP end point doesn't support models with decoupled transaction policy" in answer["error"]
    assert "generate_stream" in answer["error"]


def _stats(port: int, model: str) -> dict:
    return call(port, "GET", f"/v2/models/{model}/stats")[2]["model_stats"][0]["inference_stats"]


def test_a_client_that_disconnects_cancels_its_request(daemon, repository):
    marker = repository / "endless" / "cancelled.txt"
    body = json.dumps({"id": "gone-http", "IN": 1}).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/endless/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                     + body)
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(65536)
    assert b"200 OK" in received.split(b"\r\n", 1)[0]
    wait_until(lambda: marker.exists() and "gone-http" in marker.read_text(), timeout=30,
               what="the model to see request.is_cancelled()", interval=0.05)
    wait_until(lambda: _stats(daemon.port, "endless")["fail"]["count"] >= 1, timeout=30,
               what="the cancelled request in the statistics", interval=0.05)
    assert _stats(daemon.port, "endless")["fail"]["count"] == 1  # counted once, as cancelled


def test_statistics_count_each_streamed_request_once(daemon):
    before = _stats(daemon.port, "words")["success"]["count"]
    _events(daemon.port, "/v2/models/words/generate_stream", {"text_input": "a b c d e"})
    assert _stats(daemon.port, "words")["success"]["count"] == before + 1
