"""Receive-slot starvation on the gRPC port (security round 4, high 4): a handful of calls that announce a
large message and stall (raw HTTP/2, ``h2``) used to hold every receive slot, so that every other
client's unary call waited until its deadline (60 s), ServerLive included. Now health reads nothing, a
small message takes no slot (the transport sees its prefix), a stalled message loses its slot once it
falls behind grpc_receive_min_rate past grpc_receive_grace, and a freed slot goes to the connection
holding fewest: another client's ServerLive and ModelInfer answer within a second while the stallers keep
stalling."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.examples import build_example_repository
from tests.grpc_util import MODEL_INFER
from tests.h2_client import H2Grpc, framed
from tests.health_watch import HealthWatch
from tests.waiting import wait_until

ADDRESS_SPACE = 4 << 30
MESSAGE = 64 << 20
GRACE = 0.5
STALLERS = 8
"""Twice the receive slots (max_request_memory_bytes // max_request_bytes = 4)."""
PROBE_SECONDS = 4.0
LIVE = "/inference.GRPCInferenceService/ServerLive"
_CODES = {str(code.value[0]): code.name for code in grpc.StatusCode}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("slots") / "repo")


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, prefix=("prlimit", f"--as={ADDRESS_SPACE}"), env={
        "APPLIANCE_MAX_REQUEST_BYTES": str(MESSAGE),
        "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(4 * MESSAGE),
        "APPLIANCE_GRPC_RECEIVE_GRACE": str(GRACE),
    })


class _Staller(threading.Thread):
    """Calls that announce a message of ``MESSAGE // 2`` bytes, send 1 KiB of it and stall; each call the
    server ends is replaced by another. ``held``: calls the server opened its window on (read them, in a
    receive slot); ``ended``: how the server ended the others."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.path = path
        self.held = 0
        self.ended: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with H2Grpc(self.port, timeout=30) as client:
            while not self.stop.is_set() and not client.closed:
                stream = client.open(self.path)
                client.send(stream, b"\x00" + (MESSAGE // 2).to_bytes(4, "big") + bytes(1024))
                counted = False
                while stream not in client.ended and not client.closed and not self.stop.is_set():
                    client.pump(0.1)
                    if not counted and stream in client.window_opened:
                        counted = True
                        self.held += 1
                status = client.trailers.get(stream, {}).get("grpc-status")
                if status is not None:
                    self.ended.append(_CODES.get(status, status))


def _infer_request() -> bytes:
    return pb.ModelInferRequest(model_name="simple", raw_input_contents=[bytes(64), bytes(64)], inputs=[
        pb.ModelInferRequest.InferInputTensor(name=name, datatype="INT32", shape=[1, 16])
        for name in ("INPUT0", "INPUT1")]).SerializeToString()


def _wait_until(condition, seconds: float, what: str) -> None:
    wait_until(condition, timeout=seconds, what=what, interval=0.05)


def test_stalled_senders_hold_no_slot_another_client_needs(daemon):
    stallers = [_Staller(daemon.grpc_port, MODEL_INFER) for _ in range(STALLERS)]
    stallers += [_Staller(daemon.grpc_port, LIVE) for _ in range(STALLERS // 2)]
    slowest: dict[str, float] = {"live": 0.0, "infer": 0.0}
    codes: list[str] = []
    with HealthWatch(daemon, keep_alive=False), grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        live, infer = channel.unary_unary(LIVE), channel.unary_unary(MODEL_INFER)
        live(b"", timeout=5)  # the channel is connected before the stallers come
        for staller in stallers:
            staller.start()
        try:
            _wait_until(lambda: sum(s.held for s in stallers) >= 4, 10, "the stallers never took the slots")
            until = time.monotonic() + PROBE_SECONDS
            while time.monotonic() < until:
                for name, call, message in (("live", live, b""), ("infer", infer, _infer_request())):
                    started = time.monotonic()
                    try:
                        call(message, timeout=5)
                        codes.append("OK")
                    except grpc.RpcError as error:
                        codes.append(f"{name}: {error.code().name}: {error.details()}")
                    slowest[name] = max(slowest[name], time.monotonic() - started)
                time.sleep(0.1)
        finally:
            for staller in stallers:
                staller.stop.set()
            for staller in stallers:
                staller.join(10)
    assert set(codes) == {"OK"}, [code for code in codes if code != "OK"][:4]
    assert max(slowest.values()) < 1.0, slowest
    ended = [code for staller in stallers for code in staller.ended]
    assert "DEADLINE_EXCEEDED" in ended, ended[:8]  # stalled messages lost their slots: cut by the meter
    assert all(staller.ended.count("OK") == len(staller.ended) for staller in stallers if staller.path == LIVE)


def test_a_message_sent_before_the_servers_settings_arrive_is_received(daemon):
    """A client's first calls go out under HTTP/2's default windows (grpc-core's do): a message larger
    than them still comes through once the server opens the window (it did not on the appliance's
    transport: the window it opened was one the client had shrunk meanwhile, and the message stalled)."""
    with H2Grpc(daemon.grpc_port, settled=False) as client:
        stream = client.open(MODEL_INFER)
        big = pb.ModelInferRequest(model_name="simple", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype="INT32", shape=[1, 16])], raw_input_contents=[bytes(1 << 20)])
        assert client.send(stream, framed(big.SerializeToString()), end=True, deadline=10)
        assert client.status(stream, seconds=10) == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])


def test_a_slow_but_steady_message_is_received_and_a_trickle_is_cut(daemon):
    """Above grpc_receive_min_rate (256 KiB/s) a message may take its time; below it, past the grace, the
    call ends with DEADLINE_EXCEEDED."""
    def message(size: int) -> bytes:
        return framed(pb.ModelInferRequest(model_name="simple", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype="INT32", shape=[1, 16])], raw_input_contents=[bytes(size)]).SerializeToString())

    with H2Grpc(daemon.grpc_port) as client:
        steady = client.open(MODEL_INFER)
        large = message(4 << 20)
        for start in range(0, len(large), 256 << 10):  # 4 MiB at ~4 MiB/s: 16x the rate, past the grace
            assert client.send(steady, large[start:start + (256 << 10)], deadline=10)
            client.pump(0.05)
        assert client.send(steady, b"", end=True)
        assert client.status(steady, seconds=10) == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
        trickle = client.open(MODEL_INFER)
        started = time.monotonic()
        small = message(1 << 20)
        for start in range(0, len(small), 1024):  # 10 KiB/s
            if not client.send(trickle, small[start:start + 1024], deadline=10) or trickle in client.ended:
                break
            client.pump(0.1)
        assert client.status(trickle, seconds=10) == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        assert "grpc_receive_min_rate" in client.trailers[trickle].get("grpc-message", "")
        assert time.monotonic() - started < GRACE + 3
