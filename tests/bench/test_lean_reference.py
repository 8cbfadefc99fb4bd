"""The lean reference (bench.lean_reference) is honest: it answers an infer as the appliance would (the
same v2 JSON for FP32 outputs, non-finite values included), refuses bad JSON and inputs with 400, and
takes no request without its token when it has one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from appliance.engine.types import InferOutput, InferResponse
from appliance.rest.codec import encode_infer_response
from bench.lean_reference import BadRequest, decode, encode, read_model
from bench.process import start_lean_reference
from bench.triton_models import write_repository

_TOKEN = "test-token-0123456789abcdef"


def _post(url: str, body: bytes, token: str | None = _TOKEN) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_it_serves_the_identity_and_refuses_bad_requests(tmp_path):
    repo = write_repository(tmp_path / "repo")
    server = start_lean_reference(repo / "identity", tmp_path / "reference.log", "--token", _TOKEN)
    try:
        url = f"{server.base}/v2/models/identity/infer"
        data = [float(v) / 4 for v in range(32)]
        good = json.dumps({"id": "7", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 16],
                                                  "data": data}]}).encode()
        assert _post(url, good) == (200, {"model_name": "identity", "model_version": "1", "id": "7", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 16], "data": data}]})
        status, answer = _post(url, b'{"inputs": [')
        assert status == 400 and "not JSON" in answer["error"]
        assert _post(url, good, token=None)[0] == 401
        assert _post(f"{server.base}/v2/models/other/infer", good)[0] == 404
    finally:
        server.stop()
    assert server.process.returncode == 0


@pytest.mark.parametrize(("change", "words"), [
    ({"name": "INPUT1"}, "unknown input"),
    ({"datatype": "INT32"}, "datatype"),
    ({"shape": [1, 15]}, "does not match"),
    ({"shape": [9, 16]}, "batch size"),
    ({"data": list(range(15))}, "needs 16 elements"),
    ({"data": ["a"] * 16}, "does not hold FP32"),
    ({"data": [1e39] * 16}, "beyond FP32"),
])
def test_inputs_are_checked_against_the_config(tmp_path, change, words):
    model = read_model(write_repository(tmp_path / "repo") / "identity")
    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))} | change
    with pytest.raises(BadRequest, match=words):
        decode(model, json.dumps({"inputs": [item]}).encode())


@pytest.mark.parametrize("values", [[0.5, -2.0, 3e38, 0.1], [float("nan"), 0.1, float("inf"), -float("inf")]])
def test_answers_are_the_appliances_json(tmp_path, values):
    model = read_model(write_repository(tmp_path / "repo") / "identity")
    array = np.array(values * 4, dtype=np.float32).reshape(1, 16)
    theirs, _ = encode_infer_response(InferResponse("identity", 1, [InferOutput("OUTPUT0", "FP32", array)], id="x"))
    assert encode(model, "x", [("OUTPUT0", array)], None) == theirs
