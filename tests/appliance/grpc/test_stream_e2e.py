"""Decoupled models over gRPC ModelStreamInfer with tritonclient: every response in order, Triton's
triton_final_response parameter and opt-in empty final responses, errors in the stream, ModelInfer
refused, and a cancelled stream cancelling the requests in flight."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.models.decoupled import build_streaming_repository
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_streaming_repository(tmp_path_factory.mktemp("stream") / "repo")


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, model_control_mode="explicit", load_models=("simple", "repeat", "endless"))


@pytest.fixture
def client(daemon):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        yield client


def _int32(name: str, values: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


def _collect(answers: queue.Queue, count: int) -> list:
    return [answers.get(timeout=60) for _ in range(count)]


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_every_response_arrives_in_order_and_only_the_empty_last_one_is_final(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("repeat", [_int32("IN", [4, 2, 0, 1])], request_id="0",
                                  enable_empty_final_response=True)
        got = _collect(answers, 5)
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    results = [result for result, _ in got]
    assert [r.as_numpy("OUT").tolist() for r in results[:4]] == [[4], [2], [0], [1]]
    assert [r.as_numpy("IDX").tolist() for r in results[:4]] == [[0], [1], [2], [3]]
    assert [_final(r) for r in results] == [False, False, False, False, True]
    empty = results[4].get_response()
    assert empty.id == "0" and empty.model_name == "repeat" and not empty.outputs
    assert answers.empty()


def test_without_the_opt_in_the_empty_final_response_is_not_sent(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("repeat", [_int32("IN", [])], request_id="none", enable_empty_final_response=True)
        client.async_stream_infer("repeat", [_int32("IN", [9])], request_id="one")
        got = _collect(answers, 2)
        # Nothing more may come for "one" (its final flag came alone): the model sends that flag right after its
        # response, so anything the flag made would come before the answer to a request sent after that response.
        client.async_stream_infer("repeat", [_int32("IN", [])], request_id="after", enable_empty_final_response=True)
        (after,) = _collect(answers, 1)
    finally:
        client.stop_stream()
    by_id = {result.get_response().id: result for result, _ in got}
    assert set(by_id) == {"none", "one"}
    assert _final(by_id["none"]) and not by_id["none"].get_response().outputs
    assert by_id["one"].as_numpy("OUT").tolist() == [9] and not _final(by_id["one"])
    assert after[1] is None and after[0].get_response().id == "after" and _final(after[0])
    assert answers.empty()


def test_an_error_response_comes_in_the_stream_and_the_stream_goes_on(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("repeat", [_int32("IN", [1, -1, 3])], request_id="e")
        got = _collect(answers, 3)
    finally:
        client.stop_stream()
    assert got[0][0].as_numpy("OUT").tolist() == [1]
    assert isinstance(got[1][1], InferenceServerException) and "negative value at 1" in got[1][1].message()
    assert got[2][0].as_numpy("OUT").tolist() == [3]


def test_a_model_that_answers_once_marks_its_response_final(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        client.async_stream_infer("simple", inputs, request_id="s")
        ((result, error),) = _collect(answers, 1)
    finally:
        client.stop_stream()
    assert error is None and _final(result)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_model_infer_refuses_a_decoupled_model(client):
    with pytest.raises(InferenceServerException,
                       match="ModelInfer RPC doesn't support models with decoupled transaction policy"):
        client.infer("repeat", [_int32("IN", [1])])


def test_reserved_triton_parameters_are_checked(daemon):
    with grpc.insecure_channel(daemon.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="repeat", id="r")
        tensor = request.inputs.add(name="IN", datatype="INT32", shape=[1])
        tensor.contents.int_contents.append(1)
        request.parameters["triton_anything"].bool_param = True
        bad_type = pb.ModelInferRequest()
        bad_type.CopyFrom(request)
        del bad_type.parameters["triton_anything"]
        bad_type.parameters["triton_enable_empty_final_response"].int64_param = 1
        answers = list(stub.ModelStreamInfer(iter([request, bad_type]), timeout=60))
    errors = sorted(a.error_message for a in answers)
    assert len(errors) == 2
    assert "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param" in errors[0]
    assert "parameter keys starting with 'triton_' are reserved for Triton usage" in errors[1]


def test_cancelling_the_stream_cancels_the_requests_in_flight(client, repository):
    marker = repository / "endless" / "cancelled.txt"
    gone = "gone"
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("endless", [_int32("IN", [1])], request_id=gone)
    _collect(answers, 3)
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: marker.exists() and gone in marker.read_text(), timeout=30,
               what="the model to see request.is_cancelled()", interval=0.05)


def _stream(daemon, requests: list, metadata=()) -> tuple[list, grpc.RpcError | None]:
    with grpc.insecure_channel(daemon.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers: list = []
        try:
            for answer in stub.ModelStreamInfer(iter(requests), timeout=60, metadata=metadata or None):
                answers.append(answer)
        except grpc.RpcError as error:
            return answers, error
    return answers, None


def _repeat_request(values: list[int], request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="repeat", id=request_id)
    request.inputs.add(name="IN", datatype="INT32", shape=[len(values)]).contents.int_contents.extend(values)
    return request


def test_triton_grpc_error_ends_the_stream_with_the_failed_responses_status(daemon):
    """Triton's ``triton_grpc_error: true`` header (issue 24 item 2): a response that fails ends the
    stream with its status (tritonclient then sees the error, not a stream that never ends)."""
    answers, error = _stream(daemon, [_repeat_request([1, -1, 3], "g")], (("triton_grpc_error", "true"),))
    assert [a.infer_response.id for a in answers] == ["g"]  # the response before the failure
    assert error is not None and "negative value at 1" in error.details()
    assert error.code() != grpc.StatusCode.OK
    # Without the header the error comes in the stream and the stream goes on.
    answers, error = _stream(daemon, [_repeat_request([1, -1, 3], "h")])
    assert error is None and sum(1 for a in answers if a.error_message) == 1 and len(answers) == 3


def test_a_request_refused_before_it_runs_comes_back_with_only_its_id(daemon):
    """As Triton: the error and the request's id (no model name, no final flag), even with
    triton_grpc_error (the stream goes on)."""
    unknown = pb.ModelInferRequest(model_name="nope", id="which")
    answers, error = _stream(daemon, [unknown], (("triton_grpc_error", "true"),))
    assert error is None and len(answers) == 1
    assert "unknown model" in answers[0].error_message
    assert answers[0].infer_response == pb.ModelInferResponse(id="which")
