"""request_deadline (off by default, as in Triton): a decoupled model that never sends its final flag, and
a model with one instance calling itself (BLS), no longer hold their requests for ever: past the deadline
the request is cancelled and its caller told DEADLINE_EXCEEDED, and the model serves on."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import write_python_model
from tests.waiting import wait_until

DEADLINE = 1.0

# Sends one response and never its final flag; a thread notes in seen.txt when the request turns cancelled.
NEVER_FINAL = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = os.path.join(args["model_repository"], "seen.txt")

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            threading.Thread(target=self.watch, args=(request,), daemon=True).start()
        return None

    def watch(self, request):
        deadline = time.monotonic() + 60
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(self.seen, "a") as seen:
            seen.write(f"{request.request_id()} {request.is_cancelled()}\\n")
"""

NEVER_FINAL_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# One instance; IN > 0 calls this same model with IN - 1 and answers what that call gave (its error
# text and code, if any); IN == 0 answers at once.
CALLS_ITSELF = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            text = b"done"
            if value > 0:
                inner = pb_utils.InferenceRequest(
                    model_name="calls_itself", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([value - 1], np.int32))]).exec()
                if inner.has_error():
                    text = f"{inner.error().code()}|{inner.error().message()}".encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=object))]))
        return responses
"""

CALLS_ITSELF_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deadline") / "repo"
    write_python_model(root, "never_final", NEVER_FINAL, NEVER_FINAL_CONFIG)
    write_python_model(root, "calls_itself", CALLS_ITSELF, CALLS_ITSELF_CONFIG)
    return root


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, "--request-deadline", str(DEADLINE))


def test_a_stream_without_a_final_flag_ends_deadline_exceeded_and_the_model_sees_it(daemon, repository):
    answers: queue.Queue = queue.Queue()
    lost = "lost"
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
        try:
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([7], np.int32))
            started = time.monotonic()
            client.async_stream_infer("never_final", [tensor], request_id=lost)
            _, first, error = answers.get(timeout=30)
            assert error is None and first.as_numpy("OUT").tolist() == [7]
            ended, _, error = answers.get(timeout=10 * DEADLINE)
        finally:
            client.stop_stream(cancel_requests=True)  # (without it, a stream that never ends waits for ever)
    assert error is not None and "request_deadline" in error.message()
    assert DEADLINE <= ended - started < 10 * DEADLINE
    seen = repository / "never_final" / "seen.txt"
    wait_until(lambda: seen.exists() and lost in seen.read_text(), timeout=30, interval=0.05,
               what="the model noting the lost request")
    assert f"{lost} True" in seen.read_text()  # the model saw request.is_cancelled()


def _calls_itself(client, value: int) -> str:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return client.infer("calls_itself", [tensor]).as_numpy("OUT")[0].decode()


def test_a_model_calling_itself_with_one_instance_gets_an_error_instead_of_holding_it(daemon):
    with httpclient.InferenceServerClient(daemon.url, network_timeout=10 * DEADLINE) as client:
        started = time.monotonic()
        code, message = _calls_itself(client, 1).split("|", 1)
        assert time.monotonic() - started < 10 * DEADLINE
        assert int(code) == 4 and "did not complete within request_deadline" in message  # UNAVAILABLE
        assert _calls_itself(client, 0) == "done"  # the instance is free again
