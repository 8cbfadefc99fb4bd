"""Decoupled ensembles and steps that leave out an output, held to real Triton 2.51 (tests/oracle): the
same requests to Triton and to the appliance serving the same repository get the same answers (outputs,
sequence parameters, final flags, errors, configs). Skipped, with the reason, where Triton cannot run."""

from __future__ import annotations

import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.appliance.repository.ensemble.decoupled_repos import decoupled_repository
from tests.oracle.install import TritonUnavailable, install
from tests.oracle.server import TritonServer

MODELS = ["rsq", "rfan", "outer", "partial_out", "partial_chain"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return decoupled_repository(tmp_path_factory.mktemp("parity") / "repo")


@pytest.fixture(scope="module")
def triton(repository, tmp_path_factory):
    try:
        server = TritonServer(repository, model_control="explicit", args=[f"--load-model={m}" for m in MODELS],
                              triton=install(), log_path=tmp_path_factory.mktemp("triton") / "triton.log").start()
    except TritonUnavailable as error:
        pytest.skip(f"real Triton unavailable: {error}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    return module_daemon(repository, *args)


@pytest.fixture(scope="module")
def servers(triton, daemon) -> list[tuple[str, str, str]]:
    """(name, HTTP base, gRPC address) of both."""
    return [("triton", triton.base, triton.grpc_url),
            ("appliance", f"http://127.0.0.1:{daemon.port}", daemon.grpc_url)]


def _stream(grpc_url: str, model: str, values: list[int], outputs: tuple[str, ...] = (), **options) -> list:
    """Every message of one streamed request: (outputs, parameters) or ("error", text)."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
            tensor.set_data_from_numpy(np.array(values, np.int32))
            client.async_stream_infer(model, [tensor], request_id="1", enable_empty_final_response=True,
                                      outputs=[grpcclient.InferRequestedOutput(o) for o in outputs] or None, **options)
            got = []
            while True:
                result, error = answers.get(timeout=60)
                if error is not None:
                    return [*got, ("error", error.message())]
                message = result.get_response()
                parameters = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in message.parameters.items()}
                got.append(({o.name: result.as_numpy(o.name).tolist() for o in message.outputs}, parameters))
                if parameters["triton_final_response"]:
                    return got
        finally:
            client.stop_stream()


def _both(servers, ask) -> dict:
    return {name: ask(http, grpc) for name, http, grpc in servers}


def _answers(messages: list) -> list:
    """The messages with outputs, without where the final flag rode (on the last answer or alone: either
    server may do either, depending on which step finishes last)."""
    return [(outputs, {k: v for k, v in parameters.items() if k != "triton_final_response"})
            for outputs, parameters in messages if outputs != "error" and outputs]


@pytest.mark.parametrize(("model", "values", "options"), [
    ("rfan", [2, 1, 3], {}),
    ("outer", [2, 3], {}),
    ("rsq", [], {}),
    ("rsq", [1, 2], {"sequence_id": 7, "sequence_start": True}),
    ("rsq", [2, 1], {"outputs": ("IDX",)}),
])
def test_streamed_answers_match_triton(servers, model, values, options):
    answers = _both(servers, lambda http, grpc: _stream(grpc, model, values, **options))
    assert _answers(answers["appliance"]) == _answers(answers["triton"])
    for messages in answers.values():
        assert [parameters["triton_final_response"] for _, parameters in messages].count(True) == 1


def test_answers_of_one_request_are_the_same_set_and_errors_the_same_words(servers):
    # slow_square runs on two instances and squares 1 before 3. Triton answers as the squares come and pairs
    # the n-th IDX with the n-th square to arrive (IDX 0 with SQ 1); the appliance answers in IN's order,
    # each IDX with its own element's square (docs/differences-from-triton.md)
    answers = _both(servers, lambda http, grpc: _stream(grpc, "rsq", [3, 1, 2]))
    for name in ("SQ", "IDX"):
        assert sorted(o[name][0] for o, _ in _answers(answers["appliance"])) == sorted(
            o[name][0] for o, _ in _answers(answers["triton"]))
    assert [(o["IDX"], o["SQ"]) for o, _ in _answers(answers["appliance"])] == [([0], [9]), ([1], [1]), ([2], [4])]
    errors = _both(servers, lambda http, grpc: _stream(grpc, "rsq", [4, -1, 5])[-1])
    assert errors["appliance"] == errors["triton"] == ("error", "in ensemble 'rsq', negative value at 1")


def _infer(base: str, model: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/v2/models/{model}/infer", data=json.dumps(body).encode(), method="POST")
    return json.load(urllib.request.urlopen(request, timeout=30))


@pytest.mark.parametrize(("model", "outputs"), [("partial_out", None), ("partial_out", ["B"]),
                                                ("partial_chain", None)])
def test_a_step_that_leaves_out_an_output_answers_as_triton(servers, model, outputs):
    body: dict = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [3]}]}
    if outputs:
        body["outputs"] = [{"name": name} for name in outputs]
    answers = _both(servers, lambda http, grpc: _infer(http, model, body))
    assert answers["appliance"] == answers["triton"]


def test_the_ensemble_config_says_decoupled_as_triton(servers):
    def policy(http: str, grpc: str) -> dict:
        with urllib.request.urlopen(f"{http}/v2/models/rsq/config", timeout=30) as answer:
            return json.load(answer)["model_transaction_policy"]

    answers = _both(servers, policy)
    assert answers["appliance"] == answers["triton"] == {"decoupled": True}
