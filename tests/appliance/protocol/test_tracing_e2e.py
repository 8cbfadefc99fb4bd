"""Triton's trace extension end to end: settings over REST (tritonclient.http), requests over REST and
gRPC, and the trace file the daemon writes under its state dir."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.builders import identity_model, write_model
from tests.waiting import wait_until

ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
         "COMPUTE_END", "REQUEST_END"]
# The front ends' marks around the core's, as Triton names them (NVIDIA's trace_summary.py keeps only traces
# that carry HTTP_RECV_START or GRPC_WAITREAD_START).
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", *ORDER, "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ORDER = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *ORDER, "GRPC_SEND_START", "GRPC_SEND_END"]


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
    traces: list[dict] = []

    def enough() -> list[dict] | None:
        nonlocal traces
        if path.exists():
            traces = json.loads(path.read_text())  # a valid JSON list after every write
            if len(traces) >= count:
                return traces
        return None

    try:
        return wait_until(enough, timeout=10, what=f"{count} traces in {path}", interval=0.05)
    except AssertionError:
        raise AssertionError(f"{path} holds {len(traces)} traces, expected {count}") from None


def test_traced_requests_are_written_with_ordered_timestamps(daemon):
    with triton.InferenceServerClient(daemon.url) as client:
        _trace_over_http_and_grpc(daemon, client)


def _trace_over_http_and_grpc(daemon, client) -> None:
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
    orders = []
    for trace in traces:
        assert trace["model_name"] == "identity" and trace["model_version"] == 1
        orders.append([s["name"] for s in trace["timestamps"]])
        times = [s["ns"] for s in trace["timestamps"]]
        assert times == sorted(times) and times[0] > 0
    assert sorted(orders) == sorted([HTTP_ORDER] * 3 + [GRPC_ORDER])


def test_a_models_settings_and_the_refusals(daemon, client):
    client.update_trace_settings(settings={"trace_level": ["OFF"]})
    changed = client.update_trace_settings(model_name="other", settings={"trace_level": ["TIMESTAMPS"],
                                                                        "trace_count": "1", "trace_rate": "1"})
    assert changed["trace_count"] == "1"
    assert client.get_trace_settings()["trace_level"] == ["OFF"]
    trace_file = Path(client.get_trace_settings()["trace_file"])
    numbered = set(trace_file.parent.glob(trace_file.name + ".*"))
    _infer(client, "identity")  # global level OFF: not traced
    _infer(client, "other")
    _infer(client, "other")  # trace_count ran out
    assert client.get_trace_settings(model_name="other")["trace_count"] == "0"
    # As Triton: the traces a trace_count allowed go to a numbered file of their own once it runs out.
    new = wait_until(lambda: set(trace_file.parent.glob(trace_file.name + ".*")) - numbered, timeout=10,
                     what="the numbered trace file", interval=0.05)
    (counted,) = new
    traces = _read_traces(counted, 1)
    assert [t["model_name"] for t in traces] == ["other"]

    with pytest.raises(InferenceServerException, match="404|not found|unknown"):
        client.get_trace_settings(model_name="nope")
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        client.update_trace_settings(settings={"trace_file": "/etc/passwd"})
    with pytest.raises(InferenceServerException, match="unknown trace level"):
        client.update_trace_settings(settings={"trace_level": ["LOTS"]})


def test_start_up_trace_flags_as_tritonserver_spells_them(start_daemon, repository, tmp_path):
    # L0_trace: tritonserver --trace-config triton,file=... --trace-config level=TIMESTAMPS --trace-config rate=1
    path = tmp_path / "out" / "global_unittest.log"
    daemon = start_daemon(repository, "--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", "rate=1", "--trace-config=mode=triton", "--trace-config",
                          "triton,log-frequency=0")
    with triton.InferenceServerClient(daemon.url) as client:
        initial = {"trace_file": str(path), "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                   "log_frequency": "0", "trace_mode": "triton"}
        assert client.get_trace_settings() == initial and client.get_trace_settings(model_name="identity") == initial
        client.update_trace_settings(model_name="other", settings={"log_frequency": "2"})
        for _ in range(2):
            _infer(client, "identity")
        for _ in range(3):
            _infer(client, "other")
        client.update_trace_settings(settings={"trace_rate": "9"})
        client.update_trace_settings(settings={"trace_rate": None})  # back to the start-up value, not 1000
        assert client.get_trace_settings() == initial
    assert [t["model_name"] for t in _read_traces(path, 2)] == ["identity", "identity"]
    assert [len(_read_traces(Path(f"{path}.{i}"), n)) for i, n in ((0, 2), (1, 1))] == [2, 1]  # other's own files


def test_bad_trace_flags_stop_the_daemon_with_the_reason(start_daemon, repository):
    for flags, words in ((["--trace-config", "level=LOUD"], "invalid value for trace level option: LOUD"),
                         (["--trace-config", "mode=zipkin"], "invalid value for trace mode option"),
                         (["--trace-config", "opentelemetry,port=4318"], "the opentelemetry settings are url"),
                         (["--trace-config", "rate"], "option format is")):
        with pytest.raises(RuntimeError, match="exited") as failed:
            start_daemon(repository, *flags)
        assert words in str(failed.value)
