"""Streamed BLS calls (``exec(decoupled=True)``) through a real daemon, as Triton's L0_backend_python
decoupled and async_execute suites use them: ``ResponseIterator.cancel()`` asks the called model to
stop and still delivers what it sends (a model that ignores the cancellation streams on), and an async
execute() awaiting streamed calls serves its requests concurrently."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import write_python_model

# Streams IN every 50 ms, up to COUNT responses; unless IGNORE is set it checks is_cancelled() before
# each one and, once cancelled, ends with a CANCELLED error (Triton's response_sender_until_cancelled).
UNTIL_CANCELLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            ignore = bool(pb_utils.get_input_tensor_by_name(request, "IGNORE").as_numpy()[0])
            sender = request.get_response_sender()
            for sent in range(count):
                if not ignore and request.is_cancelled():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "request has been cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                time.sleep(0.05)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

UNTIL_CANCELLED_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Sums the streamed responses of until_cancelled and cancels the stream once the sum reaches MAX_SUM
# (Triton's decoupled_bls_cancel); SUM, whether a CANCELLED error came back, and the responses read.
BLS_CANCEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            max_sum = int(pb_utils.get_input_tensor_by_name(request, "MAX_SUM").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="until_cancelled", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([1], np.int32)),
                        pb_utils.Tensor("COUNT", np.array([20], np.int32)),
                        pb_utils.get_input_tensor_by_name(request, "IGNORE")])
            stream = call.exec(decoupled=True)
            total, cancelled, read = 0, False, 0
            for response in stream:
                if response.has_error():
                    cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                    break
                if not response.output_tensors():
                    continue
                read += 1
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                if total >= max_sum:
                    stream.cancel()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], np.bool_)),
                pb_utils.Tensor("READ", np.array([read], np.int32))]))
        return responses
"""

BLS_CANCEL_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "MAX_SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IS_CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "READ" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

# async execute() that sleeps WAIT seconds and answers once with the final flag (Triton's
# async_execute_decouple), and one that reaches it through an awaited streamed BLS call per request
# (Triton's async_execute_decouple_bls).
SLEEPER = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT").as_numpy().flat[0]) for r in requests]
        await asyncio.gather(*(asyncio.sleep(wait) for wait in waits))
        for request, wait in zip(requests, waits):
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([wait], np.float32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SLEEPER_BLS = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def forward(self, request):
        call = pb_utils.InferenceRequest(model_name="sleeper", requested_output_names=["OUT"],
                                         inputs=[pb_utils.get_input_tensor_by_name(request, "WAIT")])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self.forward(request) for request in requests))
        return None
"""

SLEEPER_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "WAIT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

WAIT = 2.0
"""Seconds each sleeper request takes: eight of them one after the other would take 16."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("bls-streams")
    write_python_model(repo, "until_cancelled", UNTIL_CANCELLED, UNTIL_CANCELLED_CONFIG)
    write_python_model(repo, "bls_cancel", BLS_CANCEL, BLS_CANCEL_CONFIG)
    write_python_model(repo, "sleeper", SLEEPER, SLEEPER_CONFIG)
    write_python_model(repo, "sleeper_bls", SLEEPER_BLS, SLEEPER_CONFIG)
    return repo


def _bls_cancel(client, max_sum: int, ignore: bool) -> tuple[int, bool, int]:
    tensors = [httpclient.InferInput("MAX_SUM", [1], "INT32"), httpclient.InferInput("IGNORE", [1], "BOOL")]
    tensors[0].set_data_from_numpy(np.array([max_sum], np.int32))
    tensors[1].set_data_from_numpy(np.array([ignore], np.bool_))
    result = client.infer("bls_cancel", tensors)
    return (int(result.as_numpy("SUM")[0]), bool(result.as_numpy("IS_CANCELLED")[0]),
            int(result.as_numpy("READ")[0]))


def test_a_cancelled_bls_stream_ends_with_the_called_models_cancelled_error(client):
    total, cancelled, read = _bls_cancel(client, max_sum=5, ignore=False)
    assert cancelled  # the called model saw is_cancelled() and said so in its last response
    assert 5 <= total < 20 and read == total  # it stopped early; nothing was cut before the error came


def test_a_bls_stream_cancel_that_the_called_model_ignores_delivers_every_response(client):
    total, cancelled, read = _bls_cancel(client, max_sum=5, ignore=True)
    assert not cancelled and total == read == 20  # Triton keeps delivering: the cancel is a request


def test_async_execute_serves_streamed_bls_requests_concurrently(daemon):
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
        try:
            tensor = grpcclient.InferInput("WAIT", [1], "FP32")
            tensor.set_data_from_numpy(np.array([WAIT], np.float32))
            started = time.monotonic()
            for index in range(8):
                client.async_stream_infer("sleeper_bls", [tensor], request_id=str(index))
            got = [answers.get(timeout=30) for _ in range(8)]
        finally:
            client.stop_stream()
    assert all(error is None and result.as_numpy("OUT").tolist() == [WAIT] for _, result, error in got)
    last = max(at for at, _, _ in got) - started
    # together about WAIT; 5x that leaves a busy box its time and still fails the 8 * WAIT of one at a time
    assert last < 5 * WAIT, f"eight {WAIT} s requests took {last:.1f} s: they ran one after another"
