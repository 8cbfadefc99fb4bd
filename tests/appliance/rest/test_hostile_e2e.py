"""A hand-written corpus of hostile requests: each gets a 4xx JSON error, the daemon stays up and
answers, and its memory comes back to where it was."""

from __future__ import annotations

import json
import struct

import pytest

from appliance.examples import build_example_repository
from tests.http_util import call
from tests.processes import rss_mib


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("x") / "repo")


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
