"""The order of a response's outputs, as Triton gives it: a request that names no outputs gets every one
the model made in the order the model made them (NVIDIA's decoupled repeat example sends IDX then OUT,
its config lists OUT then IDX); a request that names them gets them in its own order."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import write_python_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""

# Makes IDX before OUT: the reverse of its config.
REVERSED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([7], np.uint32)),
                                                         pb_utils.Tensor("OUT", values)]))
        return responses
"""

# One response per element, IDX then OUT, as NVIDIA's repeat example.
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index, value in enumerate(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                                                        pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("order")
    write_python_model(repo, "reversed", REVERSED, CONFIG)
    write_python_model(repo, "repeat", REPEAT, CONFIG + "model_transaction_policy { decoupled: true }\n")
    return repo


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
