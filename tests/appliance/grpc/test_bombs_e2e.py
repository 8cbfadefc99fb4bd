"""Compression bombs on the gRPC port (security round 4, high 3): eight gzip ModelInfer messages of 764 KiB,
each 768 MiB of zeros inflated, sent at once. grpc.aio (the server since removed) used to inflate each
whole on its own threads before any handler could count it (RSS 532 MiB past a 300 MiB budget), the
appliance's transport inflated on the event loop (health 0.7-2.6 s). Now the handler inflates them on a
worker thread, a step at a time, each step reserved on the request's budget first: every bomb is refused,
/v2/health/live answers within a second throughout, and RSS stays within the budget. The ratio limit is
off here (it would refuse them sooner): the budget alone must hold them."""

from __future__ import annotations

import threading
import zlib

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.examples import build_example_repository
from tests.grpc_util import MODEL_INFER
from tests.h2_client import H2Grpc, framed
from tests.health_watch import HealthSampler

ADDRESS_SPACE = 4 << 30
BUDGET = 300 << 20
INFLATED = 768 << 20
BOMBS = 8
RSS_SLACK = 64 << 20
"""Beyond the budget: the interpreter's own growth and the compressed messages."""
_CODES = {str(code.value[0]): code.name for code in grpc.StatusCode}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("bombs") / "repo")


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A ModelInferRequest for 'simple' whose raw_input_contents is 768 MiB of zeros, gzipped (764 KiB),
    made without ever holding the 768 MiB."""
    head = pb.ModelInferRequest(model_name="simple", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="INT32", shape=[1, 16])]).SerializeToString()
    size, varint = INFLATED, bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        varint.append(byte | (0x80 if size else 0))
        if not size:
            break
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(head + b"\x3a" + bytes(varint))]
    zeros = bytes(1 << 20)
    parts += [compressor.compress(zeros) for _ in range(INFLATED >> 20)]
    parts.append(compressor.flush())
    return b"".join(parts)


def _send_bomb(port: int, bomb: bytes, answers: list[tuple[str, str]]) -> None:
    with H2Grpc(port, timeout=60) as client:
        stream = client.open(MODEL_INFER, (("grpc-encoding", "gzip"),))
        client.send(stream, framed(bomb, compressed=True), end=True)
        status = client.status(stream, seconds=120)
        message = client.trailers.get(stream, {}).get("grpc-message", "")
    answers.append((_CODES.get(status or "", f"no status ({status!r})"), message))


def _good_compressed_call(port: int, algorithm: grpc.Compression) -> pb.ModelInferResponse:
    request = pb.ModelInferRequest(model_name="simple", raw_input_contents=[bytes(64), bytes(64)], inputs=[
        pb.ModelInferRequest.InferInputTensor(name=name, datatype="INT32", shape=[1, 16])
        for name in ("INPUT0", "INPUT1")])
    with grpc.insecure_channel(f"127.0.0.1:{port}", compression=algorithm) as channel:
        raw = channel.unary_unary(MODEL_INFER)(request.SerializeToString(), timeout=30)
    return pb.ModelInferResponse.FromString(raw)


def test_compression_bombs_are_refused_within_the_budget_with_health_answering(module_daemon, repository, bomb):
    daemon = module_daemon(repository, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), env={
        "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(BUDGET),
        "APPLIANCE_MAX_INFLATION_RATIO": "0",
    })
    answers: list[tuple[str, str]] = []
    with HealthSampler(daemon, keep_alive=False, timeout=5.0) as watch:
        senders = [threading.Thread(target=_send_bomb, args=(daemon.grpc_port, bomb, answers)) for _ in range(BOMBS)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(180)
    assert daemon.process.poll() is None, f"the daemon died: {daemon.log()[-2000:]}"
    assert not watch.failures, watch.failures[:5]
    assert watch.slowest < 1.0, f"/v2/health/live took {watch.slowest:.2f} s while the bombs inflated"
    assert watch.peak - watch.baseline < (BUDGET + RSS_SLACK) / 2**20, (watch.baseline, watch.peak)
    assert len(answers) == BOMBS and {code for code, _ in answers} <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}, answers
    for algorithm in (grpc.Compression.Gzip, grpc.Compression.Deflate):  # compression still works
        assert _good_compressed_call(daemon.grpc_port, algorithm).model_name == "simple"
