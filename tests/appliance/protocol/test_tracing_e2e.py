"""Triton's trace extension end to end: settings over REST (tritonclient.http), requests over REST and
gRPC, and the trace file the daemon writes under its state dir."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.builders import identity_model, write_model

ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
         "COMPUTE_END", "REQUEST_END"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "identity", identity_model(["FP32"]))
    write_model(repo, "other", identity_model(["FP32"]))
    return repo


def _infer(client, model: str = "identity") -> None:
    module = triton_grpc if isinstance(client, triton_grpc.InferenceServerClient) else triton
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = module.InferInput("IN_FP32", [2, 4], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def _read_traces(path: Path, count: int) -> list[dict]:
    """The traces in ``path`` once it holds ``count`` of them (written by a thread: polled)."""
    deadline = time.monotonic() + 10
    traces: list[dict] = []
    while time.monotonic() < deadline:
        if path.exists():
            traces = json.loads(path.read_text())  # a valid JSON list after every write
            if len(traces) >= count:
                return traces
        time.sleep(0.05)
    raise AssertionError(f"{path} holds {len(traces)} traces, expected {count}")


def test_traced_requests_are_written_with_ordered_timestamps(daemon, client):
    assert "trace" in client.get_server_metadata()["extensions"]
    defaults = client.get_trace_settings()
    assert defaults["trace_level"] == ["OFF"] and defaults["trace_rate"] == "1000"
    trace_file = Path(defaults["trace_file"])
    assert trace_file.parent == daemon.log_path.parent / "traces"

    answered = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert answered["trace_level"] == ["TIMESTAMPS"] and answered["trace_rate"] == "1"
    assert client.get_trace_settings(model_name="identity")["trace_rate"] == "1"  # follows the global ones

    for _ in range(3):
        _infer(client)
    with triton_grpc.InferenceServerClient(daemon.grpc_url) as grpc_client:
        _infer(grpc_client)

    traces = _read_traces(trace_file, 4)
    assert len(traces) == 4 and len({t["id"] for t in traces}) == 4
    for trace in traces:
        assert trace["model_name"] == "identity" and trace["model_version"] == 1
        names = [s["name"] for s in trace["timestamps"]]
        assert names == ORDER
        times = [s["ns"] for s in trace["timestamps"]]
        assert times == sorted(times) and times[0] > 0


def test_a_models_settings_and_the_refusals(daemon, client):
    client.update_trace_settings(settings={"trace_level": ["OFF"]})
    changed = client.update_trace_settings(model_name="other", settings={"trace_level": ["TIMESTAMPS"],
                                                                        "trace_count": "1", "trace_rate": "1"})
    assert changed["trace_count"] == "1"
    assert client.get_trace_settings()["trace_level"] == ["OFF"]
    trace_file = Path(client.get_trace_settings()["trace_file"])
    before = len(json.loads(trace_file.read_text())) if trace_file.exists() else 0
    _infer(client, "identity")  # global level OFF: not traced
    _infer(client, "other")
    _infer(client, "other")  # trace_count ran out
    traces = _read_traces(trace_file, before + 1)
    time.sleep(0.3)
    traces = json.loads(trace_file.read_text())
    assert [t["model_name"] for t in traces[before:]] == ["other"]
    assert client.get_trace_settings(model_name="other")["trace_count"] == "0"

    with pytest.raises(InferenceServerException, match="404|not found|unknown"):
        client.get_trace_settings(model_name="nope")
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        client.update_trace_settings(settings={"trace_file": "/etc/passwd"})
    with pytest.raises(InferenceServerException, match="unknown trace level"):
        client.update_trace_settings(settings={"trace_level": ["LOTS"]})
