"""Every error path of the serving path: status code, a JSON {"error": ...} that says what was expected,
and a daemon that keeps serving afterwards."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from appliance.examples import mlp_model
from tests.builders import identity_model, write_model
from tests.http_util import call

LIMIT = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def daemon(module_daemon, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "mlp", mlp_model())
    write_model(repo, "identity", identity_model(["FP32", "BYTES", "INT32"]))
    return module_daemon(repo, "--max-request-bytes", str(LIMIT))


def _infer(daemon, body, model="mlp", headers=None, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return call(daemon.port, "POST", path, body, headers)


def _good_json(batch=1):
    return {"inputs": [{"name": "input", "shape": [batch, 784], "datatype": "FP32", "data": [0.5] * (784 * batch)}]}


def _binary_body(header: dict, *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), {"Inference-Header-Content-Length": str(len(head))}


CASES = {
    "unknown model": (404, "unknown model: 'nope'", dict(model="nope", body=_good_json())),
    "unknown version": (404, "version 7 is not found", dict(version="7", body=_good_json())),
    "bad version": (404, "Not Found: no route for POST /v2/models/mlp/versions/abc/infer; a model version",
                    dict(version="abc", body=_good_json())),  # Triton's routes take only digits there
    "malformed json": (400, "malformed JSON", dict(body="{not json")),
    "not an object": (400, "JSON object", dict(body="[1, 2]")),
    "no inputs": (400, "expected 1 inputs but got 0 inputs for model", dict(body={"inputs": []})),
    "wrong input name": (400, "Got input(s) ['image'], but missing required input(s) ['input']", dict(body={
        "inputs": [{"name": "image", "shape": [1, 784], "datatype": "FP32", "data": [0.0] * 784}]})),
    "wrong datatype": (400, "expects 'FP32'", dict(body={
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "INT32", "data": [0] * 784}]})),
    "unknown datatype": (400, "unknown datatype 'FLOAT'", dict(body={
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FLOAT", "data": [0] * 784}]})),
    "wrong shape": (400, "Expected [-1,784], got [1,783]", dict(body={
        "inputs": [{"name": "input", "shape": [1, 783], "datatype": "FP32", "data": [0.0] * 783}]})),
    "batch too large": (400, "inference request batch-size must be <= 4", dict(body=_good_json(batch=5))),
    "data count mismatch": (400, "needs 784 elements, 'data' has 3", dict(body={
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [1, 2, 3]}]})),
    "non-numeric data": (400, "does not hold FP32", dict(body={
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": ["x"] * 784}]})),
    "negative shape": (400, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
                       dict(body={
        "inputs": [{"name": "input", "shape": [1, -784], "datatype": "FP32", "data": [0.0]}]})),
    "missing data": (400, "Input must set only one of the following fields: 'data'", dict(body={
        "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32"}]})),
    "unknown output": (400, "unexpected inference output 'logits'", dict(body={
        **_good_json(), "outputs": [{"name": "logits"}]})),
    "missing input": (400, "missing required input(s) ['IN_INT32']", dict(model="identity", body={"inputs": [
        {"name": "IN_FP32", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4},
        {"name": "IN_BYTES", "shape": [1, 4], "datatype": "BYTES", "data": ["a"] * 4}]})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_json_error_paths(daemon, case):
    status, message, kwargs = CASES[case]
    code, headers, payload = _infer(daemon, **kwargs)
    assert code == status, payload
    assert headers["Content-Type"].startswith("application/json")
    assert set(payload) == {"error"}
    assert message in payload["error"]


def _binary_header(size: int, shape=(1, 784), datatype="FP32", name="input"):
    return {"inputs": [{"name": name, "shape": list(shape), "datatype": datatype,
                        "parameters": {"binary_data_size": size}}]}


BINARY_CASES = {
    "byte count short of shape": (_binary_header(100), [b"\0" * 100], "[request id: <id_unknown>] input byte size "
                                  "mismatch for input 'input' for model 'mlp'. Expected 3136, got 100"),
    "size beyond body": (_binary_header(3136), [b"\0" * 10], "only 10 bytes of binary data remain"),
    "negative size": (_binary_header(-4), [], "non-negative integer"),
    "huge size": (_binary_header(2**62), [b"\0" * 8], "binary data remain"),
    "trailing bytes": (_binary_header(3136), [b"\0" * 3140], "4 bytes of binary data that no input"),
    "bytes element overruns": (
        _binary_header(8, shape=(1, 4), datatype="BYTES", name="IN_BYTES"),
        [struct.pack("<I", 1000) + b"abcd"], "expected 4 string elements for inference input 'IN_BYTES' for model "
                                             "'identity', got 1"),
}


@pytest.mark.parametrize("case", list(BINARY_CASES))
def test_binary_error_paths(daemon, case):
    header, chunks, message = BINARY_CASES[case]
    model = "identity" if header["inputs"][0]["name"] != "input" else "mlp"
    if model == "identity":
        header["inputs"] += [
            {"name": "IN_FP32", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4},
            {"name": "IN_INT32", "shape": [1, 4], "datatype": "INT32", "data": [0] * 4},
        ]
    body, headers = _binary_body(header, *chunks)
    code, _, payload = _infer(daemon, body, model=model, headers=headers)
    assert code == 400, payload
    assert message in payload["error"]


def test_header_length_larger_than_body(daemon):
    code, _, payload = _infer(daemon, b'{"inputs": []}', headers={"Inference-Header-Content-Length": "999"})
    assert code == 400 and payload["error"].startswith("inference header size should be in range (0, 14), got: 999")


def test_header_length_not_a_number(daemon):
    code, _, payload = _infer(daemon, b"{}", headers={"Inference-Header-Content-Length": "-5"})
    assert code == 400 and "non-negative integer" in payload["error"]


def test_body_too_large(daemon):
    body = b"x" * (LIMIT + 1)
    code, _, payload = _infer(daemon, body)
    assert code == 413
    assert "max_request_bytes" in payload["error"]


@pytest.mark.parametrize("ready", [[True], "yes", 1, [[[[[[True]]]]]]])
def test_repository_index_ready_must_be_a_boolean_in_tritons_words(daemon, ready):
    """qa L0_http test_repository_index_deeply_nested_json: Triton 2.51 answers a 'ready' that is not a
    boolean (nested arrays included) with these words (its status 500; here 400: the request is at fault)."""
    status, _, payload = call(daemon.port, "POST", "/v2/repository/index", {"ready": ready})
    assert status == 400 and "attempt to access JSON non-boolean as boolean" in payload["error"]
    assert "Invalid value for 'ready': expected a boolean" in payload["error"]  # the later releases' words
    for depth in (150, 250_000):  # the qa's: deeper than any JSON parser here reads
        deep = b'{"ready": ' + b"[" * depth + b"true" + b"]" * depth + b"}"
        status, _, payload = call(daemon.port, "POST", "/v2/repository/index", deep)
        assert status == 400 and "Invalid value for 'ready': expected a boolean" in payload["error"]
        assert payload["error"].startswith("attempt to access JSON non-boolean as boolean")
    assert call(daemon.port, "POST", "/v2/repository/index", {"ready": True})[0] == 200


def test_unknown_route_and_method(daemon):
    code, _, payload = call(daemon.port, "GET", "/v3/whatever")
    assert code == 404 and "/v2" in payload["error"]
    code, _, payload = call(daemon.port, "DELETE", "/v2/models/mlp/infer")
    assert code == 405 and "error" in payload


def test_errors_through_tritonclient_and_daemon_keeps_serving(daemon):
    with triton.InferenceServerClient(daemon.url) as client:
        bad = triton.InferInput("input", [1, 10], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 10), np.float32))
        with pytest.raises(InferenceServerException, match="unexpected shape") as info:
            client.infer("mlp", [bad])
        assert info.value.status() == "400"
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_model_metadata("nope")
        good = triton.InferInput("input", [1, 784], "FP32")
        good.set_data_from_numpy(np.zeros((1, 784), np.float32))
        assert client.infer("mlp", [good]).as_numpy("probabilities").shape == (1, 10)
    assert daemon.process.poll() is None
