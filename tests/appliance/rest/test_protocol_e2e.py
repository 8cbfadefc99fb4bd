"""Where Triton's HTTP API has a precise rule, the appliance follows it: raw binary requests, which
outputs go binary, duplicate outputs, nested data, BYTES that are not UTF-8, classification bounds, and
the words of load failures."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from appliance.examples import build_example_repository
from tests.builders import OPSET, save
from tests.http_util import call
from tests.models import copy_model

HEADER = "Inference-Header-Content-Length"


def _wide_identity():
    """x -> y, FP32 [batch, any]: an output as large as the client asks."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    return helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "wide", [x], [y]),
                             opset_imports=OPSET)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    copy_model(repo, "front_ends/bytes_identity")
    save(_wide_identity(), repo / "wide" / "1" / "model.onnx")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, model_control_mode="explicit",
                             load_models=("simple", "mlp", "bytes_identity", "wide"))


def _split(body: bytes, headers: dict) -> tuple[dict, bytes]:
    length = int(headers.get(HEADER, len(body)))
    return json.loads(body[:length]), body[length:]


def test_raw_binary_request_is_the_single_input(daemon):
    image = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    status, headers, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", image.tobytes(), {HEADER: "0"})
    assert status == 200, payload
    header, raw = _split(payload, headers)
    (output,) = header["outputs"]
    assert output["parameters"]["binary_data_size"] == len(raw) == 40  # outputs come back binary
    got = np.frombuffer(raw, np.float32)
    as_json = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": image.ravel().tolist()}]}
    expected = call(daemon.port, "POST", "/v2/models/mlp/infer", as_json)[2]["outputs"][0]["data"]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_raw_binary_request_needs_a_single_input_model(daemon):
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", b"\0" * 64, {HEADER: "0"})
    assert status == 400 and payload["error"].startswith(  # Triton's words, then the fix
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'simple' model configuration; ")
    status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", b"\0" * 10, {HEADER: "0"})
    assert status == 400, payload


def test_binary_data_output_is_only_the_default_for_outputs_not_listed(daemon):
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")]
    body = {"inputs": inputs, "parameters": {"binary_data_output": True},
            "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": True}}]}
    status, headers, payload = call(daemon.port, "POST", "/v2/models/simple/infer", body)
    assert status == 200
    header, raw = _split(payload, headers)
    by_name = {o["name"]: o for o in header["outputs"]}
    assert by_name["OUTPUT0"]["data"] == [2 * i for i in range(16)]  # listed without binary_data: JSON
    assert by_name["OUTPUT1"]["parameters"]["binary_data_size"] == 64 == len(raw)
    unlisted = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    header, raw = _split(*reversed(call(daemon.port, "POST", "/v2/models/simple/infer", unlisted)[1:]))
    assert all("binary_data_size" in o["parameters"] for o in header["outputs"]) and len(raw) == 128


def test_duplicate_output_names_are_refused(daemon):
    """As Triton's later releases (qa L0_http test_duplicate_output_names; 2.51 returned it once: see
    docs/differences-from-triton.md); gRPC alike (tests/appliance/engine/test_validation.py)."""
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for n in ("INPUT0", "INPUT1")]
    body = {"inputs": inputs, "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", body)
    assert status == 400 and payload["error"] == "output 'OUTPUT0' already exists in request"


def test_json_nesting_deeper_than_tritons_limit_is_refused(daemon):
    """Triton's later releases refuse a request nested past 100 levels (qa L0_http
    test_json_recursion_depth_limit; 2.51 took any depth)."""
    def nested(depth):
        value = [1] * 16
        for _ in range(depth):
            value = [value]
        return value
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": nested(120)} for n in ("INPUT0", "INPUT1")]
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", {"inputs": inputs})
    assert status == 400 and "JSON nesting depth exceeds maximum allowed limit (100)" in payload["error"]
    inputs = [{**tensor, "data": nested(50)} for tensor in inputs]
    assert call(daemon.port, "POST", "/v2/models/simple/infer", {"inputs": inputs})[0] == 200


def test_any_nesting_with_the_right_element_count_is_accepted(daemon):
    x = [[[[v]] for v in range(784)]]
    body = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": x}]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", body)
    assert status == 200, payload


def test_bytes_that_are_not_utf8_are_never_altered(daemon):
    items = [b"\xff\xfe", b"ok", b"\x80", b"fine"]
    raw = b"".join(struct.pack("<I", len(i)) + i for i in items)
    header = json.dumps({"inputs": [{"name": "IN_BYTES", "shape": [1, 4], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    status, _, payload = call(daemon.port, "POST", "/v2/models/bytes_identity/infer", header + raw,
                              {HEADER: str(len(header))})
    assert status == 400 and "not valid UTF-8" in payload["error"] and "binary_data" in payload["error"]
    with triton.InferenceServerClient(daemon.url) as client:
        tensor = triton.InferInput("IN_BYTES", [1, 4], "BYTES")
        tensor.set_data_from_numpy(np.array([items], dtype=object))
        result = client.infer("bytes_identity", [tensor],
                              outputs=[triton.InferRequestedOutput("OUT_BYTES", binary_data=True)])
        assert result.as_numpy("OUT_BYTES").ravel().tolist() == items


def test_classification_of_a_huge_output_is_refused(daemon):
    data = np.zeros((1, 1_000_001), np.float32)
    with triton.InferenceServerClient(daemon.url, connection_timeout=60, network_timeout=60) as client:
        tensor = triton.InferInput("x", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        with pytest.raises(InferenceServerException, match="classification output tensor too large"):
            client.infer("wide", [tensor], outputs=[triton.InferRequestedOutput("y", class_count=3)])
        small = triton.InferInput("x", [1, 5], "FP32")
        small.set_data_from_numpy(np.array([[0.1, 0.9, 0.3, 0.7, 0.0]], np.float32))
        result = client.infer("wide", [small], outputs=[triton.InferRequestedOutput("y", class_count=2)])
        assert [v.decode() for v in result.as_numpy("y").ravel()] == ["0.900000:1", "0.700000:3"]


def test_load_failures_say_failed_to_load(daemon):
    with triton.InferenceServerClient(daemon.url) as client:
        for name in ("broken", "no_such_model"):
            with pytest.raises(InferenceServerException, match=f"failed to load '{name}'"):
                client.load_model(name)
        with pytest.raises(InferenceServerException, match="failed to load 'simple'"):
            client.load_model("simple", config='{"max_batch_size": "x"}')


def test_a_model_that_failed_to_load_has_no_available_versions(daemon):
    """As Triton: 404 with its words, then why (a failed load is not retried by asking again); its ready
    endpoint answers Triton's 400."""
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "BYTES", "data": ["1"] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple_string/infer", body)
    assert status == 404
    assert payload["error"].startswith("Request for unknown model: 'simple_string' has no available versions; ")
    status, _, payload = call(daemon.port, "GET", "/v2/models/simple_string/ready")
    assert (status, payload) == (400, {"error": "Model version not ready"})


def test_a_push_that_does_not_load_keeps_the_model_serving(daemon):
    """File overrides are served (tests/appliance/rest/test_push_e2e.py); files that are no model fail
    the load with Triton's words, and the versions already serving go on."""
    body = {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}}
    status, _, payload = call(daemon.port, "POST", "/v2/repository/models/simple/load", body)
    assert status == 400 and "failed to load 'simple'" in payload["error"]
    assert call(daemon.port, "GET", "/v2/models/simple/ready")[0] == 200
