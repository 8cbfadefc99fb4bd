"""Every RPC of Triton's GRPCInferenceService through Triton's own gRPC client, against the daemon as users
start it (real onnxruntime models)."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from appliance.examples import mlp_model
from tests.builders import DATATYPES, affine_model, identity_model, sample_tensor, two_output_model, write_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "identity", identity_model(DATATYPES))
    write_model(repo, "mlp", mlp_model(seed=3))
    write_model(repo, "two_outputs", two_output_model())
    for version in (1, 2):
        write_model(repo, "affine", affine_model(scale=version, offset=10 * version), version=version,
                    config='version_policy: { all { } }\n')
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


@pytest.fixture(scope="module")
def client(daemon):
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def stub(daemon):
    with grpc.insecure_channel(daemon.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _reference(repo, model: str, feeds: dict[str, np.ndarray], version: int = 1) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / str(version) / "model.onnx"))
    feeds = {k: v.astype(str) if v.dtype == object else v for k, v in feeds.items()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _input(name: str, data: np.ndarray, datatype: str = "FP32") -> triton.InferInput:
    tensor = triton.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def _code(excinfo) -> str:
    return excinfo.value.status()


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata.name == "triton" and metadata.version  # what Triton's clients check
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(metadata.extensions)


def test_model_ready(client):
    assert client.is_model_ready("mlp") and client.is_model_ready("affine", "2")
    assert not client.is_model_ready("nonexistent")  # as Triton: not ready, not an error
    assert not client.is_model_ready("affine", "9")
    wrong_version = "failed to get model version from specified version string 'two'"
    with pytest.raises(InferenceServerException, match=wrong_version) as excinfo:
        client.is_model_ready("affine", "two")
    assert _code(excinfo) == "StatusCode.INVALID_ARGUMENT"


def test_model_metadata_and_config(client):
    metadata = client.get_model_metadata("identity")
    assert metadata.name == "identity" and metadata.platform == "onnxruntime_onnx" and metadata.versions == ["1"]
    shapes = {t.name: (t.datatype, list(t.shape)) for t in metadata.inputs}
    assert shapes["IN_FP16"] == ("FP16", [-1, 4]) and shapes["IN_BYTES"] == ("BYTES", [-1, 4])
    assert client.get_model_metadata("affine", "1").versions == ["1", "2"]
    config = client.get_model_config("identity").config  # Triton's own ModelConfig message
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert config.backend == "onnxruntime" and config.instance_group[0].count == 2
    json_config = client.get_model_config("identity", as_json=True)["config"]
    assert json_config["default_model_filename"] == "model.onnx"
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'") as excinfo:
        client.get_model_metadata("nope")
    assert _code(excinfo) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_model_config("affine", "7")
    assert _code(excinfo) == "StatusCode.NOT_FOUND"


def test_every_datatype_round_trips(client, repository):
    inputs, feeds = [], {}
    for index, datatype in enumerate(DATATYPES):
        data = sample_tensor(datatype, (2, 4), seed=index)
        inputs.append(_input(f"IN_{datatype}", data, datatype))
        feeds[f"IN_{datatype}"] = data
    result = client.infer("identity", inputs, outputs=[triton.InferRequestedOutput(f"OUT_{d}") for d in DATATYPES])
    expected = _reference(repository, "identity", feeds)
    for datatype in DATATYPES:
        got, want = result.as_numpy(f"OUT_{datatype}"), expected[f"OUT_{datatype}"]
        if datatype == "BYTES":
            assert [g.decode() for g in got.ravel()] == list(want.ravel())
        else:
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        assert result.get_output(f"OUT_{datatype}").datatype == datatype


def test_typed_contents(stub):
    """Typed ``contents`` instead of raw bytes (the generated stub, as grpc_explicit_*_client.py do)."""
    request = pb.ModelInferRequest(model_name="affine", model_version="2", id="typed")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend([float(i) for i in range(8)])
    response = stub.ModelInfer(request)
    assert response.id == "typed" and response.model_version == "2"
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], np.float32), np.arange(8) * 2 + 20)
    request.raw_input_contents.append(np.zeros(8, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ModelInfer(request)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents field must not be specified when using raw_input_contents for 'x'" in excinfo.value.details()


def test_outputs_id_parameters_and_versions(client):
    """What comes back is tested below the transports (tests/appliance/protocol/test_inference.py); here:
    the request's id, parameters, outputs and version reach it and come back in the message."""
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    result = client.infer("two_outputs", [_input("x", x)], outputs=[triton.InferRequestedOutput("square")],
                          request_id="req-42", priority=0, timeout=1_000_000)
    response = result.get_response()
    assert response.id == "req-42" and [o.name for o in response.outputs] == ["square"]
    assert result.as_numpy("double") is None
    np.testing.assert_array_equal(result.as_numpy("square"), x * x)
    ones = np.ones((1, 8), np.float32)
    assert client.infer("affine", [_input("x", ones)]).get_response().model_version == "2"
    np.testing.assert_allclose(client.infer("affine", [_input("x", ones)], model_version="1").as_numpy("y"),
                               ones + 10)


def test_classification(client):
    """class_count reaches the data plane (whose top classes are tested there) and its BYTES answer comes
    back as Triton's "value:index" strings."""
    x = np.random.default_rng(7).standard_normal((2, 784)).astype(np.float32)
    result = client.infer("mlp", [_input("input", x)],
                          outputs=[triton.InferRequestedOutput("probabilities", class_count=3)])
    top = result.as_numpy("probabilities")
    assert top.shape == (2, 3)
    for classes in top:
        values = [item.decode().split(":") for item in classes]
        assert [float(value) for value, _ in values] == sorted((float(value) for value, _ in values), reverse=True)
        assert all(0 <= int(index) < 10 for _, index in values)


@pytest.mark.parametrize("call,code,message", [
    (lambda c: c.infer("nope", [_input("x", np.ones((1, 8), np.float32))]), "NOT_FOUND", "unknown model: 'nope'"),
    (lambda c: c.infer("affine", [_input("x", np.ones((1, 8), np.float32))], model_version="5"), "NOT_FOUND",
     "version 5 is not found"),
    (lambda c: c.infer("affine", [_input("x", np.ones((1, 8), np.int32), "INT32")]), "INVALID_ARGUMENT",
     "data-type is 'INT32', but model 'affine' expects 'FP32'"),
    (lambda c: c.infer("affine", [_input("x", np.ones((1, 7), np.float32))]), "INVALID_ARGUMENT",
     "unexpected shape for input 'x'"),
    (lambda c: c.infer("affine", [_input("x", np.ones((9, 8), np.float32))]), "INVALID_ARGUMENT",
     "inference request batch-size must be <= 4"),
    (lambda c: c.infer("affine", [_input("z", np.ones((1, 8), np.float32))]), "INVALID_ARGUMENT",
     "Got input(s) ['z'], but missing required input(s) ['x']"),
    (lambda c: c.infer("affine", [_input("x", np.ones((1, 8), np.float32))],
                       outputs=[triton.InferRequestedOutput("w")]),
     "INVALID_ARGUMENT", "unexpected inference output 'w'"),
])
def test_errors_map_to_tritons_status_codes(client, call, code, message):
    with pytest.raises(InferenceServerException) as excinfo:
        call(client)
    assert _code(excinfo) == f"StatusCode.{code}"
    assert message in excinfo.value.message()


def test_statistics_count_every_request(client):
    before = client.get_inference_statistics("two_outputs").model_stats[0]
    x = np.ones((3, 6), np.float32)
    for _ in range(2):
        client.infer("two_outputs", [_input("x", x)])
    stats = client.get_inference_statistics("two_outputs", "1").model_stats[0]
    assert (stats.name, stats.version) == ("two_outputs", "1")
    assert stats.inference_count - before.inference_count == 6
    assert stats.inference_stats.success.count - before.inference_stats.success.count == 2
    assert stats.inference_stats.compute_infer.ns > 0 and stats.last_inference > 0
    assert any(b.batch_size == 3 for b in stats.batch_stats)
    everything = client.get_inference_statistics()
    assert {s.name for s in everything.model_stats} >= {"two_outputs", "identity", "mlp", "affine"}
    as_json = client.get_inference_statistics("two_outputs", as_json=True)
    assert int(as_json["model_stats"][0]["inference_count"]) == stats.inference_count
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available") as excinfo:
        client.get_inference_statistics("nope")
    assert _code(excinfo) == "StatusCode.INVALID_ARGUMENT"  # Triton's words and status


def test_metrics_count_grpc_requests(client, daemon):
    import urllib.request

    client.infer("two_outputs", [_input("x", np.ones((1, 6), np.float32))])
    text = urllib.request.urlopen(f"{daemon.base}/metrics", timeout=10).read().decode()
    line = next(row for row in text.splitlines()
                if row.startswith('nv_inference_request_success{model="two_outputs",version="1"}'))
    assert float(line.split()[-1]) >= 1


def test_repository_index(client):
    index = client.get_model_repository_index()
    rows = {(m.name, m.version, m.state) for m in index.models}
    assert {("mlp", "1", "READY"), ("affine", "1", "READY"), ("affine", "2", "READY")} <= rows
    assert client.get_model_repository_index(as_json=True)["models"]


def test_control_is_refused_outside_explicit_mode(client):
    explicit_only = "explicit model load / unload is not allowed if polling is enabled; .*--model-control-mode explicit"
    with pytest.raises(InferenceServerException, match=explicit_only) as excinfo:
        client.load_model("mlp")
    assert _code(excinfo) == "StatusCode.UNAVAILABLE"  # Triton's words and status
    with pytest.raises(InferenceServerException, match="not allowed"):
        client.unload_model("mlp")


def test_stream_answers_each_request_and_reports_errors_in_stream(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = np.arange(8, dtype=np.float32).reshape(1, 8)
        for index in range(6):
            client.async_stream_infer("affine", [_input("x", x * index)], request_id=f"s{index}", model_version="1")
        client.async_stream_infer("affine", [_input("x", np.ones((1, 3), np.float32))], request_id="bad")
        client.async_stream_infer("nope", [_input("x", x)], request_id="missing")
        results, errors = {}, []
        for _ in range(8):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error.message())
            else:
                results[result.get_response().id] = result.as_numpy("y")
    finally:
        client.stop_stream()
    assert sorted(results) == [f"s{i}" for i in range(6)]
    for index in range(6):
        np.testing.assert_allclose(results[f"s{index}"], x * index + 10)
    assert len(errors) == 2
    assert any("unexpected shape for input 'x'" in e for e in errors)
    assert any("unknown model: 'nope'" in e for e in errors)


def test_stream_error_carries_the_request_id(stub):
    request = pb.ModelInferRequest(model_name="nope", id="which-one")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0" * 4)
    (answer,) = list(stub.ModelStreamInfer(iter([request])))
    assert "unknown model" in answer.error_message and answer.infer_response.id == "which-one"


def test_trace_settings(client):
    settings = client.get_trace_settings().settings
    assert list(settings["trace_level"].value) == ["OFF"] and list(settings["trace_rate"].value) == ["1000"]
    updated = client.update_trace_settings(model_name="mlp", settings={"trace_rate": "5",
                                                                       "trace_level": ["TIMESTAMPS"]}).settings
    assert list(updated["trace_rate"].value) == ["5"] and list(updated["trace_level"].value) == ["TIMESTAMPS"]
    assert list(client.get_trace_settings().settings["trace_rate"].value) == ["1000"]  # only mlp's changed
    assert list(client.get_trace_settings("mlp").settings["trace_rate"].value) == ["5"]
    cleared = client.update_trace_settings(model_name="mlp", settings={"trace_rate": None}).settings
    assert list(cleared["trace_rate"].value) == ["1000"]
    with pytest.raises(InferenceServerException, match="Unable to parse 'trace_count'") as excinfo:
        client.update_trace_settings(settings={"trace_count": "many"})
    assert _code(excinfo) == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as excinfo:
        client.update_trace_settings(settings={"trace_file": "/tmp/trace.json"})
    assert _code(excinfo) == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope") as excinfo:
        client.get_trace_settings("nope")
    assert _code(excinfo) == "StatusCode.INVALID_ARGUMENT"  # as Triton


def test_unary_rpcs_are_all_served(daemon):
    """Every RPC of the service has a handler here (none answers gRPC's own UNIMPLEMENTED 'Method not
    found')."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    with grpc.insecure_channel(daemon.grpc_url) as channel:
        for method in service.methods:
            if method.client_streaming:
                continue
            request_type = getattr(pb, method.input_type.name)
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method.name}",
                                       request_serializer=request_type.SerializeToString,
                                       response_deserializer=lambda raw: raw)
            try:
                call(request_type(), timeout=10)
            except grpc.RpcError as exc:
                assert "Method not found" not in (exc.details() or ""), method.name
