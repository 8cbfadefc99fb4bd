"""Iterative sequences and request rescheduling through a real daemon, with Triton's clients: a
token-by-token Python model streamed over HTTP generate_stream and gRPC, several streams batched step by
step, a model that answers on its second run (gRPC infer, BLS), and Triton's errors where the model's
scheduler cannot run a request again."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import copy_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterative")
    for name in ("tokens", "second_try", "wrong_return", "bls_driver"):
        copy_model(repo, f"iterative/{name}")
    # second_try under schedulers that cannot run a request again
    for scheduler in ("dynamic", "sequence"):
        copy_model(repo, "iterative/second_try", f"second_try_{scheduler}", config=scheduler)
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _generate_stream(daemon, body: dict) -> list[dict]:
    request = urllib.request.Request(f"{daemon.base}/v2/models/tokens/generate_stream", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_token_model_streams_over_generate_stream(daemon):
    events = _generate_stream(daemon, {"PROMPT": 4})
    assert [event["TOKEN"] for event in events] == [1, 2, 3, 4]


class _Stream:
    """A gRPC stream whose responses are collected per request id; leaving it cancels what is still open
    (a failed check must not leave the client waiting for responses)."""

    def __init__(self, url: str) -> None:
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def send(self, model: str, prompt: int, request_id: str, **sequence) -> None:
        tensor = grpcclient.InferInput("PROMPT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[prompt]], np.int32))
        self.client.async_stream_infer(model, [tensor], request_id=request_id, **sequence)

    def collect(self, finals: int) -> dict[str, list]:
        by_id: dict[str, list] = {}
        done = 0
        while done < finals:
            result, error = self.answers.get(timeout=30)
            if error is not None:
                raise error
            response = result.get_response()
            by_id.setdefault(response.id, []).append(result)
            done += response.parameters["triton_final_response"].bool_param
        return by_id


def test_token_streams_over_grpc_batch_step_by_step(daemon):
    prompts = {"a": 6, "b": 2, "c": 4}
    with _Stream(daemon.grpc_url) as stream:
        for request_id, prompt in prompts.items():
            stream.send("tokens", prompt, request_id)
        by_id = stream.collect(len(prompts))
        stream.send("tokens", 3, "d")  # the same stream, once the others are done
        by_id.update(stream.collect(1))
    prompts["d"] = 3
    for request_id, prompt in prompts.items():
        assert [int(r.as_numpy("TOKEN")[0, 0]) for r in by_id[request_id]] == list(range(1, prompt + 1))
    batches = [int(r.as_numpy("BATCH")[0, 0]) for results in by_id.values() for r in results]
    assert max(batches) >= 2  # several streams' steps ran in one batch
    assert max(batches) <= 4  # max_batch_size


def test_a_new_stream_joins_the_batches_of_running_ones(daemon):
    with _Stream(daemon.grpc_url) as stream:
        stream.send("tokens", 12, "long")
        first = stream.answers.get(timeout=30)  # the long one is under way
        assert first[1] is None
        stream.send("tokens", 3, "short")
        by_id = stream.collect(2)
    by_id["long"].insert(0, first[0])
    short = [int(r.as_numpy("BATCH")[0, 0]) for r in by_id["short"]]
    assert short[0] == 2  # its first step ran beside a rescheduled step of the long one
    assert [int(r.as_numpy("TOKEN")[0, 0]) for r in by_id["long"]][-1] == 12


def test_a_client_sequence_id_is_honoured_and_ends_with_its_request(daemon):
    with _Stream(daemon.grpc_url) as stream:
        stream.send("tokens", 2, "x", sequence_id=77, sequence_start=True)
        assert [int(r.as_numpy("TOKEN")[0, 0]) for r in stream.collect(1)["x"]] == [1, 2]
        stream.send("tokens", 2, "y", sequence_id=77)
        with pytest.raises(InferenceServerException, match="must specify the START flag on the first request of "
                                                           "the sequence"):
            stream.collect(1)


def test_a_rescheduled_request_is_answered_on_its_second_run(daemon):
    a, b = np.random.randn(16).astype(np.float32), np.random.randn(16).astype(np.float32)
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        inputs = [grpcclient.InferInput("A", [16], "FP32"), grpcclient.InferInput("B", [16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("second_try", inputs)
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    stats = httpclient.InferenceServerClient(daemon.url).get_inference_statistics("second_try")
    counts = stats["model_stats"][0]
    assert counts["execution_count"] >= 2 * counts["inference_stats"]["success"]["count"]


def test_concurrent_rescheduled_requests_each_get_their_answer(daemon):
    def call(value: float, answers: list) -> None:
        with httpclient.InferenceServerClient(daemon.url) as client:
            inputs = [httpclient.InferInput("A", [16], "FP32"), httpclient.InferInput("B", [16], "FP32")]
            inputs[0].set_data_from_numpy(np.full(16, value, np.float32))
            inputs[1].set_data_from_numpy(np.ones(16, np.float32))
            answers.append((value, client.infer("second_try", inputs).as_numpy("SUM")[0]))

    answers: list = []
    threads = [threading.Thread(target=call, args=(float(i), answers)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [(float(i), i + 1.0) for i in range(6)]


def test_bls_calls_reach_iterative_models(client):
    tensor = httpclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], np.int32))
    result = client.infer("bls_driver", [tensor])
    assert result.as_numpy("TOKENS").tolist() == [1, 2, 3]
    assert result.as_numpy("TOTAL").tolist() == [48.0]


@pytest.mark.parametrize("model, sequence", [
    ("second_try_dynamic", {}),
    ("second_try_sequence", {"sequence_id": 5, "sequence_start": True}),
])
def test_rescheduling_without_iterative_sequence_fails_with_tritons_words(client, model, sequence):
    shape = [1, 16] if model.endswith("dynamic") else [16]
    inputs = [httpclient.InferInput("A", shape, "FP32"), httpclient.InferInput("B", shape, "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(shape, np.float32))
    with pytest.raises(InferenceServerException,
                       match="Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE") as error:
        client.infer(model, inputs, **sequence)
    assert error.value.status() == "400"


def test_a_response_returned_for_a_rescheduled_request_is_an_error(client):
    inputs = [httpclient.InferInput("A", [16], "FP32"), httpclient.InferInput("B", [16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(16, np.float32))
    with pytest.raises(InferenceServerException, match="Expected a None object in the execute function return list "
                                                       "for reschduled request"):
        client.infer("wrong_return", inputs)
