"""Python models calling models (BLS: sync, async, decoupled), decoupled streaming, the pb_utils
surface (request fields, response parameters, Logger, custom metrics, errors) through a real daemon
with tritonclient."""

from __future__ import annotations

import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.builders import identity_model, write_model
from tests.models import copy_model, read_config


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pipelines")
    # The ONNX identity the BLS models call; bls_decoupled calls decoupled/repeat.
    write_model(repo, "identity_fp32", identity_model(["FP32"]), config=read_config("pipelines/identity_fp32"))
    copy_model(repo, "decoupled/repeat")
    for name in ("bls_sync", "bls_async", "bls_decoupled", "surface", "errors", "driver"):
        copy_model(repo, f"pipelines/{name}")
    return repo


@pytest.fixture(scope="module")
def grpc_client(daemon):
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        yield client


def _x(values):
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.asarray([values], np.float32))
    return [tensor]


def test_bls_exec_calls_the_onnx_model_through_the_server(client):
    before = client.get_inference_statistics("identity_fp32")["model_stats"][0]["inference_stats"]["success"]
    result = client.infer("bls_sync", _x([1, 2, 3, 4]))
    np.testing.assert_array_equal(result.as_numpy("Y"), [[2, 4, 6, 8]])
    after = client.get_inference_statistics("identity_fp32")["model_stats"][0]["inference_stats"]["success"]
    assert after["count"] == before["count"] + 1  # the call went through the identity's own scheduler


def test_a_bls_error_comes_back_as_a_response_error_with_tritons_words(client):
    result = client.infer("bls_sync", _x([-1, 2, 3, 4]))
    has_error, code, message = result.as_numpy("ERR")[0, 0].decode().split("|", 2)
    assert has_error == "True"
    # Triton's words, as NVIDIA's bls example prints them
    assert message == ("Model nope - Error when running inference: Failed for execute the inference request. Model "
                       "'nope' is not ready.")
    assert int(code) == 4  # UNAVAILABLE


def test_async_execute_awaits_concurrent_calls(client):
    result = client.infer("bls_async", _x([1, 2, 3, 4]))
    np.testing.assert_array_equal(result.as_numpy("Y"), [[11, 22, 33, 44]])


def test_bls_calls_from_concurrent_requests_all_come_back(daemon):
    with httpclient.InferenceServerClient(daemon.url, concurrency=8) as client:
        pending = [client.async_infer("bls_sync", _x([i, i, i, i])) for i in range(32)]
        results = [p.get_result(timeout=60).as_numpy("Y") for p in pending]
    for i, y in enumerate(results):
        np.testing.assert_array_equal(y, [[2 * i] * 4])


def test_bls_decoupled_iterates_every_response(client):
    values = httpclient.InferInput("IN", [5], "INT32")
    values.set_data_from_numpy(np.array([1, 2, 3, 4, 5], np.int32))
    result = client.infer("bls_decoupled", [values])
    assert result.as_numpy("SUM").tolist() == [15]
    assert result.as_numpy("COUNT").tolist() == [5 + 5 + 100]


def test_a_decoupled_model_streams_over_grpc(grpc_client):
    answers: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        values = grpcclient.InferInput("IN", [3], "INT32")
        values.set_data_from_numpy(np.array([7, 8, 9], np.int32))
        grpc_client.async_stream_infer("repeat", [values], request_id="r1")
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        grpc_client.stop_stream()
    assert [error for _, error in got] == [None, None, None]
    assert [result.as_numpy("OUT").tolist() for result, _ in got] == [[7], [8], [9]]


def test_request_fields_and_response_parameters(client, grpc_client):
    x = httpclient.InferInput("X", [2], "FP32")
    x.set_data_from_numpy(np.array([3, 4], np.float32))
    result = client.infer("surface", [x], request_id="abc", timeout=5_000_000,
                          parameters={"mode": "fast", "n": 3})
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["id"] == "abc"
    assert info["timeout"] == 5_000_000
    assert info["parameters"] == {"mode": "fast", "n": 3}  # no transport-only keys
    assert info["instance"] == "surface_0"  # Triton 2.51: the default group is named after the model
    assert info["ready"] is True and info["missing_ready"] is False
    assert result.get_response()["parameters"] == {"seen": True, "first": 3, "note": "from surface"}
    gx = grpcclient.InferInput("X", [2], "FP32")
    gx.set_data_from_numpy(np.array([5, 6], np.float32))
    response = grpc_client.infer("surface", [gx], request_id="g1").get_response()
    assert response.parameters["first"].int64_param == 5
    assert response.parameters["seen"].bool_param is True
    assert response.parameters["note"].string_param == "from surface"


def test_logger_lines_reach_the_daemon_log(client, daemon):
    x = httpclient.InferInput("X", [2], "FP32")
    x.set_data_from_numpy(np.array([1, 1], np.float32))
    client.infer("surface", [x])
    log = daemon.log()
    for line in ("surface info line", "surface warn line", "surface error line", "surface leveled line"):
        assert line in log
    assert "model.py:" in log  # the caller's file and line, as Triton prints them


def test_custom_metrics_are_exported(client, daemon):
    x = httpclient.InferInput("X", [2], "FP32")
    x.set_data_from_numpy(np.array([2, 2], np.float32))
    client.infer("surface", [x])
    text = urllib.request.urlopen(f"{daemon.base}/metrics", timeout=10).read().decode()
    assert "# HELP surface_requests Requests seen by surface" in text
    assert "# TYPE surface_requests counter" in text
    assert 'surface_requests{model="surface",version="1"}' in text
    assert "# TYPE surface_values histogram" in text
    assert 'surface_values_bucket{model="surface",le="10"}' in text
    assert "surface_last 2" in text


@pytest.mark.parametrize("code,status,grpc_status", [
    (0, "400", "StatusCode.UNKNOWN"), (1, "500", "StatusCode.INTERNAL"), (2, "404", "StatusCode.NOT_FOUND"),
    (3, "400", "StatusCode.INVALID_ARGUMENT"), (4, "503", "StatusCode.UNAVAILABLE"),
    (5, "501", "StatusCode.UNIMPLEMENTED"), (6, "400", "StatusCode.ALREADY_EXISTS"),
    (7, "400", "StatusCode.CANCELLED"),
])
def test_triton_error_codes_map_to_tritons_statuses(client, grpc_client, code, status, grpc_status):
    tensor = httpclient.InferInput("CODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([code], np.int32))
    with pytest.raises(InferenceServerException, match=f"code {code}") as info:
        client.infer("errors", [tensor])
    assert info.value.status() == status
    gtensor = grpcclient.InferInput("CODE", [1], "INT32")
    gtensor.set_data_from_numpy(np.array([code], np.int32))
    with pytest.raises(InferenceServerException, match=f"code {code}") as ginfo:
        grpc_client.infer("errors", [gtensor])
    assert ginfo.value.status() == grpc_status


def test_an_exception_in_execute_is_logged_with_its_traceback(client, daemon):
    tensor = httpclient.InferInput("CODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([-1], np.int32))
    with pytest.raises(InferenceServerException, match="exploded on purpose"):
        client.infer("errors", [tensor])
    log = daemon.log()
    assert "Traceback" in log and "in _boom" in log and "ValueError: exploded on purpose" in log


def test_a_model_without_inputs_is_called_with_none(client, grpc_client):
    np.testing.assert_array_equal(client.infer("driver", []).as_numpy("Y"), [[3, 3, 3, 3]])
    np.testing.assert_array_equal(grpc_client.infer("driver", []).as_numpy("Y"), [[3, 3, 3, 3]])
