"""Triton's qa/L0_decoupled ``sequence_repeat`` against a daemon: a decoupled Python ``repeat_int32`` whose
every response flows through ``identity_int32``, a model on the identity backend with an empty version
directory (before the identity backend, neither it nor the ensemble loaded); and the identity model
asked directly over HTTP and gRPC, BYTES included, with Triton's response parameters."""

from __future__ import annotations

import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.appliance.repository.ensemble.repos import ensemble_config, step, write_ensemble
from tests.models import write_python_model
from tests.models.qa_decoupled import IDENTITY_INT32_CONFIG, REPEAT_INT32, REPEAT_INT32_CONFIG

UINT32 = "TYPE_UINT32"

BYTES_CONFIG = '''
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
'''


def _identity_model(repo, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """As the qa's test.sh lays it out: repeat_int32, identity_int32 and the sequence_repeat ensemble
    (IN, DELAY, WAIT -> repeat_int32 -> OUT through identity_int32, IDX straight from repeat_int32)."""
    repo = tmp_path_factory.mktemp("identity_e2e") / "repo"
    write_python_model(repo, "repeat_int32", REPEAT_INT32, REPEAT_INT32_CONFIG)
    _identity_model(repo, "identity_int32", IDENTITY_INT32_CONFIG)
    _identity_model(repo, "identity_bytes", BYTES_CONFIG)
    write_ensemble(repo, "sequence_repeat", ensemble_config(
        [("IN", "TYPE_INT32", [-1]), ("DELAY", UINT32, [-1]), ("WAIT", UINT32, [1])],
        [("OUT", "TYPE_INT32", [1]), ("IDX", UINT32, [1])],
        [step("repeat_int32", {"IN": "IN", "DELAY": "DELAY", "WAIT": "WAIT"}, {"OUT": "repeat_out", "IDX": "IDX"}),
         step("identity_int32", {"INPUT0": "repeat_out"}, {"OUTPUT0": "OUT"})],
        max_batch_size=0))
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _inputs(values: list[int], delay_ms: int = 5, delays: int | None = None) -> list[grpcclient.InferInput]:
    tensors = []
    for name, data in (("IN", np.array(values, np.int32)),
                       ("DELAY", np.full(len(values) if delays is None else delays, delay_ms, np.uint32)),
                       ("WAIT", np.array([0], np.uint32))):
        tensor = grpcclient.InferInput(name, list(data.shape), "UINT32" if data.dtype == np.uint32 else "INT32")
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def _stream(daemon, inputs) -> list:
    """Every (result, error) of one request to sequence_repeat, up to its final response."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("sequence_repeat", inputs, enable_empty_final_response=True,
                                      outputs=[grpcclient.InferRequestedOutput("OUT"),
                                               grpcclient.InferRequestedOutput("IDX")])
            got = []
            while True:
                result, error = answers.get(timeout=60)
                got.append((result, error))
                if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                    return got
        finally:
            client.stop_stream()


def test_every_repeated_value_flows_through_the_identity_step_in_order(daemon):
    got = _stream(daemon, _inputs([4, 2, 7, 0]))
    assert all(error is None for _, error in got)
    answered = [result for result, _ in got if result.get_response().outputs]
    assert [int(r.as_numpy("OUT")[0]) for r in answered] == [4, 2, 7, 0]
    assert [int(r.as_numpy("IDX")[0]) for r in answered] == [0, 1, 2, 3]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got]
    assert finals.count(True) == 1 and finals[-1]


def test_no_value_gives_no_response_but_the_final_flag(daemon):
    got = _stream(daemon, _inputs([]))
    assert len(got) == 1 and got[0][1] is None and not got[0][0].get_response().outputs


def test_an_error_of_the_repeat_step_ends_the_request_with_its_words(daemon):
    ((_, error),) = _stream(daemon, _inputs([1], delays=2))
    assert "expected IN and DELAY shape to match, got [1] and [2]" in str(error)


def test_the_identity_model_answers_a_copy_with_tritons_response_parameters_over_http(daemon):
    with httpclient.InferenceServerClient(daemon.url) as client:
        assert client.is_model_ready("identity_int32") and client.is_model_ready("sequence_repeat")
        tensor = httpclient.InferInput("INPUT0", [3], "INT32")
        tensor.set_data_from_numpy(np.array([5, -1, 9], np.int32))
        result = client.infer("identity_int32", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [5, -1, 9]
        assert result.get_response()["parameters"] == {
            "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123}
        config = client.get_model_config("identity_int32")
        assert config["backend"] == "identity" and config["default_model_filename"] == ""
    # The backend's custom metric: the 12 bytes of INPUT0 counted (at least: the ensemble tests copy too).
    metrics = urllib.request.urlopen(daemon.base + "/metrics", timeout=10).read().decode()
    (line,) = [line for line in metrics.splitlines()
               if line.startswith('input_byte_size_counter{model="identity_int32",version="1"}')]
    assert float(line.split()[-1]) >= 12


def test_the_identity_model_copies_bytes_over_grpc(daemon):
    data = np.array([[b"a", b"\x00\xff"], [b"", b"long" * 100]], dtype=object)
    tensor = grpcclient.InferInput("INPUT0", [2, 2], "BYTES")
    tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        result = client.infer("identity_bytes", [tensor])
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()
