"""BF16 tensors end to end, as Triton's clients send them (``ml_dtypes.bfloat16`` arrays): into and out
of Python models over the binary HTTP protocol and gRPC raw contents, between models by BLS and in an
ensemble (a Python step, then a TorchScript one), to and from torch by DLPack inside the model; JSON
refuses them with Triton's words."""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import copy_model

torch = pytest.importorskip("torch")

# backends/bf16_double doubles its BF16 input in torch (both ways by DLPack), as_numpy() refusing BF16 with
# Triton's words; backends/bf16_bls hands its input to `double` (BLS) and adds the input to the answer: 3x.

TORCH_DOUBLE = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_BF16 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_BF16 dims: [ -1 ] } ]
"""

ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "twice" } },
  { model_name: "torch_double" model_version: -1 input_map { key: "INPUT__0" value: "twice" }
    output_map { key: "OUTPUT__0" value: "OUTPUT0" } }
] }
"""


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _write(repo, name, config):
    """A model with no model.py (the TorchScript step, the ensemble)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bf16")
    copy_model(repo, "backends/bf16_double", "double")
    copy_model(repo, "backends/bf16_bls", "bls_bf16")
    _write(repo, "torch_double", TORCH_DOUBLE)
    torch.jit.script(_Double()).save(str(repo / "torch_double" / "1" / "model.pt"))
    _write(repo, "quadruple", ENSEMBLE)
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


VALUES = np.array([[1.5, -2.0, 3.25, 0.0078125]], dtype=ml_dtypes.bfloat16)


def _http_input(values=VALUES, binary=True):
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "BF16")
    tensor.set_data_from_numpy(values, binary_data=binary)
    return [tensor]


@pytest.mark.parametrize("model, factor", [("double", 2), ("bls_bf16", 3), ("quadruple", 4)])
def test_bf16_over_the_binary_http_protocol(client, model, factor):
    result = client.infer(model, _http_input())
    assert result.get_response()["outputs"][0]["datatype"] == "BF16"
    output = result.as_numpy("OUTPUT0")
    assert output.dtype == ml_dtypes.bfloat16
    assert output.tolist() == (VALUES.astype(np.float32) * factor).astype(ml_dtypes.bfloat16).tolist()


@pytest.mark.parametrize("model, factor", [("double", 2), ("quadruple", 4)])
def test_bf16_over_grpc_raw_contents(daemon, model, factor):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(VALUES.shape), "BF16")
        tensor.set_data_from_numpy(VALUES)
        result = client.infer(model, [tensor])
    assert result.get_output("OUTPUT0").datatype == "BF16"
    assert result.as_numpy("OUTPUT0").tolist() == (VALUES.astype(np.float32) * factor).astype(
        ml_dtypes.bfloat16).tolist()


def test_a_torchscript_model_takes_and_returns_bf16(client):
    tensor = httpclient.InferInput("INPUT__0", list(VALUES.shape), "BF16")
    tensor.set_data_from_numpy(VALUES)
    output = client.infer("torch_double", [tensor]).as_numpy("OUTPUT__0")
    assert output.dtype == ml_dtypes.bfloat16 and output.tolist() == (VALUES.astype(np.float32) * 2).tolist()


def _post(daemon, path: str, document: dict) -> tuple[int, dict]:
    request = urllib.request.Request(daemon.base + path, data=json.dumps(document).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_json_refuses_bf16_with_tritons_words(daemon, client):
    status, body = _post(daemon, "/v2/models/double/infer", {"inputs": [
        {"name": "INPUT0", "shape": [1, 2], "datatype": "BF16", "data": [1.0, 2.0]}]})
    assert status == 400
    assert body["error"] == ("receiving BF16 data via JSON is not supported. Please use the binary data format for "
                             "input INPUT0")
    # Binary in, JSON out: the output cannot be written as JSON.
    with pytest.raises(InferenceServerException, match="sending BF16 data via JSON is not supported. Please use the "
                                                       "binary data format for output") as error:
        client.infer("double", _http_input(), outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert error.value.status() == "400"
