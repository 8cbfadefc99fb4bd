"""A hand-written corpus of hostile requests: each gets a 4xx JSON error, the daemon stays up and
answers, and its memory comes back to where it was. A valid request whose answer is costly to encode
stalls no port."""

from __future__ import annotations

import http.client
import json
import math
import struct
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from appliance.examples import build_example_repository
from tests.builders import OPSET, save
from tests.grpc_util import channel
from tests.http_util import call
from tests.processes import rss_mib


def _echo():
    """x -> y, FP32 [batch, any]: answers what it is sent."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    return helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "echo", [x], [y]),
                             opset_imports=OPSET)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    save(_echo(), repo / "echo" / "1" / "model.onnx")
    return repo


def _binary(header: dict, data: bytes, header_length: int | None = None) -> tuple[bytes, dict]:
    head = json.dumps(header).encode()
    return head + data, {"Inference-Header-Content-Length": str(len(head) if header_length is None else header_length)}


def _input(name="INPUT0", shape=(1, 16), datatype="INT32", **extra):
    return {"name": name, "shape": list(shape), "datatype": datatype, **extra}


def _corpus() -> list[tuple[str, str, bytes, dict]]:
    ok = [_input("INPUT1", data=[1] * 16)]
    cases = [
        ("truncated binary", "simple", *_binary({"inputs": [_input(parameters={"binary_data_size": 64}), *ok]}, b"\0" * 10)),
        ("header longer than body", "simple", *_binary({"inputs": ok}, b"", header_length=10_000)),
        ("negative binary size", "simple", *_binary({"inputs": [_input(parameters={"binary_data_size": -64}), *ok]}, b"")),
        ("huge binary size", "simple", *_binary({"inputs": [_input(parameters={"binary_data_size": 2**62}), *ok]}, b"\0" * 64)),
        ("float binary size", "simple", *_binary({"inputs": [_input(parameters={"binary_data_size": 6.4}), *ok]}, b"")),
        ("shape/data mismatch", "simple", json.dumps({"inputs": [_input(data=[1] * 3), *ok]}).encode(), {}),
        ("wrong datatype", "simple", json.dumps({"inputs": [_input(datatype="FP64", data=[1.0] * 16), *ok]}).encode(), {}),
        ("string data for ints", "simple", json.dumps({"inputs": [_input(data=["a"] * 16), *ok]}).encode(), {}),
        ("deep JSON", "simple", b"[" * 100_000 + b"]" * 100_000, {}),
        ("deep data", "simple", json.dumps({"inputs": [_input(data=[[[[[[[[1]]]]]]]]), *ok]}).encode(), {}),
        ("invalid UTF-8 JSON", "simple", b'{"inputs": [{"name": "\xff\xfe"}]}', {}),
        ("10k inputs", "simple", json.dumps({"inputs": [_input(f"I{i}", data=[1] * 16) for i in range(10_000)]}).encode(), {}),
        ("huge shape", "simple", json.dumps({"inputs": [_input(shape=(2**31, 2**31), data=[1]), *ok]}).encode(), {}),
        ("shape of 100 dims", "simple", json.dumps({"inputs": [_input(shape=[1] * 100, data=[1]), *ok]}).encode(), {}),
        ("null everything", "simple", b'{"inputs": [null], "outputs": null, "parameters": null, "id": null}', {}),
        ("not JSON at all", "simple", bytes(range(256)) * 4, {}),
        ("empty body", "simple", b"", {}),
        ("header length garbage", "simple", b"{}", {"Inference-Header-Content-Length": "12abc"}),
    ]
    strings = [b"\xff\xfe", b"\x80"] * 8
    raw = b"".join(struct.pack("<I", len(s)) + s for s in strings)
    good = b"".join(struct.pack("<I", 1) + b"1" for _ in range(16))
    cases.append(("non-UTF-8 BYTES", "simple_string", *_binary({"inputs": [
        _input(datatype="BYTES", parameters={"binary_data_size": len(raw)}),
        _input("INPUT1", datatype="BYTES", parameters={"binary_data_size": len(good)})]}, raw + good)))
    return cases


@pytest.mark.parametrize("case", [c[0] for c in _corpus()])
def test_hostile_request_gets_a_4xx(daemon, case):
    _, model, body, headers = next(c for c in _corpus() if c[0] == case)
    status, _, payload = call(daemon.port, "POST", f"/v2/models/{model}/infer", body, headers)
    assert 400 <= status < 500, (case, status, payload)
    assert isinstance(payload, dict) and payload.get("error"), payload


def test_daemon_survives_and_memory_returns(daemon):
    good = {"inputs": [_input(data=list(range(16))), _input("INPUT1", data=[1] * 16)]}
    for _ in range(3):  # warm up the allocator before measuring
        assert call(daemon.port, "POST", "/v2/models/simple/infer", good)[0] == 200
    baseline = rss_mib(daemon.process.pid)
    for _ in range(5):
        for _, model, body, headers in _corpus():
            assert call(daemon.port, "POST", f"/v2/models/{model}/infer", body, headers)[0] < 500
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", good)
    assert status == 200 and payload["outputs"][0]["data"][:3] == [1, 2, 3]
    assert daemon.process.poll() is None
    assert rss_mib(daemon.process.pid) < baseline + 64  # nothing sized by a claim stayed allocated


HEALTH_BOUND = 0.2
"""Seconds a health check may take while an answer is encoded (a few milliseconds when the loop is free;
the unfixed encoder stalled it for 4 s and more)."""


class _Poller(threading.Thread):
    """Asks ``check`` again and again until ``done``, after one check that opens the connection; records
    how long each check took after that one."""

    def __init__(self, check, done: threading.Event) -> None:
        super().__init__(daemon=True)
        self._check = check
        self._done = done
        self.ready = threading.Event()
        self.times: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._check()
            self.ready.set()
            while True:  # at least one check after the request is sent
                started = time.monotonic()
                self._check()
                self.times.append(time.monotonic() - started)
                if self._done.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.ready.set()


def test_an_answer_with_a_nan_stalls_no_port(daemon):
    """Issue 47: 1 Mi FP32 with one NaN (a 4 MiB request), echoed and answered as JSON. The encoder wrote
    each value with a Python step once one was not finite, on the event loop: every port stalled for
    seconds. Now health on the HTTP and gRPC ports answers at once all the while."""
    values = np.arange(1 << 20, dtype=np.float32)
    values[12345] = np.nan
    header = {"inputs": [{"name": "x", "shape": [1, values.size], "datatype": "FP32",
                          "parameters": {"binary_data_size": values.nbytes}}]}
    body, headers = _binary(header, values.tobytes())
    done = threading.Event()
    http_health = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    grpc_channel = channel(daemon.grpc_port)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc_channel)

    def http_ready() -> None:
        http_health.request("GET", "/v2/health/ready")
        response = http_health.getresponse()
        response.read()
        assert response.status == 200

    def grpc_ready() -> None:
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready

    pollers = {"HTTP": _Poller(http_ready, done), "gRPC": _Poller(grpc_ready, done)}
    try:
        for poller in pollers.values():
            poller.start()
        for poller in pollers.values():
            assert poller.ready.wait(30)
        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
        try:
            connection.request("POST", "/v2/models/echo/infer", body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        done.set()  # before the answer is parsed here: that takes this process's GIL for a while
        for poller in pollers.values():
            poller.join(60)
    finally:
        done.set()
        http_health.close()
        grpc_channel.close()
    assert response.status == 200, raw[:500]
    data = json.loads(raw)["outputs"][0]["data"]
    assert len(data) == values.size and math.isnan(data[12345])
    assert data[:3] == [0.0, 1.0, 2.0] and data[-1] == values[-1]
    for port, poller in pollers.items():
        assert poller.error is None, (port, poller.error)
        assert poller.times, port
        assert max(poller.times) < HEALTH_BOUND, (f"{port} health took {max(poller.times):.2f} s while the answer "
                                                  f"was encoded ({len(poller.times)} checks)")
