"""What a Python gRPC server costs before it does any work: the floor under the appliance's gRPC rows.

    python -m bench.grpc_floor [--calls 3000] [--repeats 3] [--concurrency 1,16]

Each server answers KServe's ModelInfer with one canned ModelInferResponse (an FP32[1,16] output, as
bench.triton's identity) and does nothing else: grpc.aio on uvloop; the same with the RPC served as
stream-unary, its one message read by the handler (how the appliance serves unary RPCs, so that it
admits a call before grpc reads the call's bytes); grpc.aio on asyncio's own loop, grpcio's
synchronous server with a thread pool, the appliance's own transport (``appliance.grpc.http2``, the
handler shape it serves, without admission or the data plane), and, when the ``h2`` package is
importable (``pip install h2``; not a dependency of the appliance), a minimal gRPC-over-HTTP/2 server on
uvloop built on h2 (unary calls only, no flow-control or admission: a floor, not a server). A client in
another process (grpcio's sync stub, one channel; c threads) sends the calls; the server's CPU time per
call comes from /proc (all its threads). The servers run one at a time, in turn, per repeat; medians go
to bench/results/grpc-floor.md beside Triton 2.51's CPU per *whole request* from bench/results/triton.json
(its gRPC identity rows), the bar these floors are held against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
MODES = ("grpc.aio, uvloop", "grpc.aio stream-unary, uvloop", "grpc.aio, asyncio", "grpc sync, 4 threads",
         "h2, uvloop", "appliance transport, uvloop")


def _response() -> Any:
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse(model_name="identity", model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    response.raw_output_contents.append(b"\0" * 64)
    return response


def _serve_grpcio(mode: str) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    canned = _response()

    class Sync(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802 - the RPC's name
            return canned

    class Async(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
            return canned

    if mode == "grpc sync, 4 threads":
        server = grpc.server(futures.ThreadPoolExecutor(4))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Sync(), server)
        print(f"PORT {server.add_insecure_port('127.0.0.1:0')}", flush=True)
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Async(), server)
        print(f"PORT {server.add_insecure_port('127.0.0.1:0')}", flush=True)
        await server.start()
        await server.wait_for_termination()

    async def raw(requests: Any, context: Any) -> Any:  # the appliance's shape: admit, then read the message
        service_pb2.ModelInferRequest.FromString(await anext(requests))
        return canned

    class StreamUnary(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            if details.method.endswith("/ModelInfer"):
                serialize = service_pb2.ModelInferResponse.SerializeToString
                return grpc.stream_unary_rpc_method_handler(raw, request_deserializer=None,
                                                            response_serializer=serialize)
            return None

    async def main_stream_unary() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((StreamUnary(),))
        print(f"PORT {server.add_insecure_port('127.0.0.1:0')}", flush=True)
        await server.start()
        await server.wait_for_termination()

    if mode == "grpc.aio, uvloop":
        import uvloop

        uvloop.run(main())
    elif mode == "grpc.aio stream-unary, uvloop":
        import uvloop

        uvloop.run(main_stream_unary())
    else:
        asyncio.run(main())


def _serve_h2() -> None:
    import h2.config
    import h2.connection
    import h2.events
    import uvloop
    from tritonclient.grpc import service_pb2

    answer = _response().SerializeToString()
    message = b"\0" + struct.pack(">I", len(answer)) + answer
    config = h2.config.H2Configuration(client_side=False, header_encoding=None)

    class Connection(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.h2 = h2.connection.H2Connection(config=config)
            self.h2.initiate_connection()
            transport.write(self.h2.data_to_send())
            self.bodies: dict[int, bytearray] = {}

        def data_received(self, data: bytes) -> None:
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    self.bodies[event.stream_id] = bytearray()
                elif isinstance(event, h2.events.DataReceived):
                    self.bodies[event.stream_id] += event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    body = self.bodies.pop(event.stream_id)
                    service_pb2.ModelInferRequest.FromString(bytes(body[5:]))  # parsed, as a server must
                    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
                    self.h2.send_headers(event.stream_id, headers)
                    self.h2.send_data(event.stream_id, message)
                    self.h2.send_headers(event.stream_id, [(b"grpc-status", b"0")], end_stream=True)
            pending = self.h2.data_to_send()
            if pending:
                self.transport.write(pending)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", 0)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def _serve_appliance() -> None:
    """The gRPC port's own transport (appliance.grpc.http2) with the handler shape the appliance serves:
    stream-unary, the one message read by the handler, no admission or data plane."""
    import grpc
    import uvloop
    from tritonclient.grpc import service_pb2

    from appliance.grpc.access import Gate
    from appliance.grpc.grpc_config import GrpcConfig
    from appliance.grpc.http2.server import Http2Server

    canned = _response()

    async def raw(requests: Any, context: Any) -> Any:
        service_pb2.ModelInferRequest.FromString(await context.read())
        return canned

    handler = grpc.stream_unary_rpc_method_handler(raw, request_deserializer=None,
                                                   response_serializer=service_pb2.ModelInferResponse.SerializeToString)
    paths = {b"/inference.GRPCInferenceService/ModelInfer": handler}

    async def main() -> None:
        server = Http2Server(GrpcConfig(), Gate(None), paths.get)  # type: ignore[arg-type]
        print(f"PORT {await server.start('127.0.0.1', 0)}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def _drive(port: int, calls: int, concurrency: int) -> float:
    """Seconds for ``calls`` ModelInfer calls from ``concurrency`` threads over one channel."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(b"\0" * 64)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(200):
            stub.ModelInfer(request)

        def worker(count: int) -> None:
            for _ in range(count):
                stub.ModelInfer(request)

        threads = [threading.Thread(target=worker, args=(calls // concurrency,)) for _ in range(concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started


def _measure(mode: str, calls: int, concurrency: int) -> dict[str, float]:
    from bench.triton import tree_cpu_seconds

    server = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "--serve", mode], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"the {mode} server did not start: {line!r}")
        port = int(line.split()[1])
        _drive(port, 200, 1)  # warm-up
        before = tree_cpu_seconds(server.pid)
        wall = _drive(port, calls, concurrency)
        cpu = tree_cpu_seconds(server.pid) - before
        done = calls // concurrency * concurrency
        return {"calls_s": done / wall, "cpu_us": cpu / done * 1e6}
    finally:
        server.kill()
        server.wait()


def _triton_bar() -> dict[int, float]:
    """Triton 2.51's CPU µs per whole gRPC identity request by concurrency, from the last bench.triton."""
    try:
        triton = json.loads((RESULTS / "triton.json").read_text())["medians"]["triton"]
    except (OSError, KeyError, ValueError):
        return {}
    bar = {}
    for key, figures in triton.items():  # "<case>|<protocol>|<c>": [inf/s, p50 ms, CPU µs/req, load]
        case, protocol, concurrency = key.split("|")
        if case.startswith("Python identity") and protocol == "grpc":
            bar[int(concurrency)] = float(figures[2])
    return bar


DECISION_RATIO = 1.2
"""The own framing stays the gRPC port's default only at this many times the h2 row (docs/security.md)."""
OWN, H2 = "appliance transport, uvloop", "h2, uvloop"


def _decision(samples: dict[tuple[str, int], list[dict[str, float]]], levels: list[int]) -> list[str]:
    """The transport decision of security round 4: the own framing against the h2 floor, per concurrency.
    The h2 row is a floor (no flow control, no admission), so a transport built on h2 costs at least
    that: the own framing at ``DECISION_RATIO`` times it is at least that much faster than any h2 one."""
    if not all((mode, c) in samples for mode in (OWN, H2) for c in levels):
        return ["", "No decision: the h2 row is missing (pip install h2)."]
    lines = ["", f"Decision: the own framing stays the default only at >= {DECISION_RATIO}x the h2 floor "
                 "(calls/s, and CPU per call the other way round).", "",
             "| c | own / h2 calls/s | h2 / own CPU per call | target |", "|---|---|---|---|"]
    for concurrency in levels:
        own, floor = samples[(OWN, concurrency)], samples[(H2, concurrency)]
        speed = statistics.median(r["calls_s"] for r in own) / statistics.median(r["calls_s"] for r in floor)
        cpu = statistics.median(r["cpu_us"] for r in floor) / statistics.median(r["cpu_us"] for r in own)
        met = "met" if min(speed, cpu) >= DECISION_RATIO else "MISSED"
        lines.append(f"| {concurrency} | {speed:.2f}x | {cpu:.2f}x | {met} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        if args.serve == "h2, uvloop":
            _serve_h2()
        elif args.serve == "appliance transport, uvloop":
            _serve_appliance()
        else:
            _serve_grpcio(args.serve)
        return
    from bench.serving import machine

    modes = list(MODES)
    try:
        import h2  # noqa: F401
    except ImportError:
        modes.remove("h2, uvloop")
        print("h2 is not installed (pip install h2): its row is left out", file=sys.stderr)
    levels = [int(c) for c in args.concurrency.split(",")]
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    loads = []
    started = time.monotonic()
    for repeat in range(args.repeats):
        for mode in modes if repeat % 2 == 0 else reversed(modes):
            for concurrency in levels:
                loads.append(os.getloadavg()[0])
                result = _measure(mode, args.calls, concurrency)
                samples.setdefault((mode, concurrency), []).append(result)
                print(f"  {repeat + 1}/{args.repeats} {mode:22} c={concurrency:<3} {result['calls_s']:7.0f} calls/s "
                      f"{result['cpu_us']:6.0f} µs CPU/call", flush=True)
    bar = _triton_bar()
    lines = [
        f"Command: python -m bench.grpc_floor --calls {args.calls} --repeats {args.repeats} --concurrency "
        f"{args.concurrency} ({time.monotonic() - started:.0f} s)", "",
        f"Machine: {machine()}; 1-minute load average {statistics.median(loads):.2f} (median; "
        f"{min(loads):.2f}-{max(loads):.2f}). Medians of {args.repeats} repeats; the server's CPU per call is all "
        "its threads'.", "",
        "| server (a canned ModelInferResponse, no work) | c | calls/s | server CPU µs per call | Triton 2.51's CPU µs "
        "per whole identity request (bench.triton) |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        for concurrency in levels:
            rows = samples[(mode, concurrency)]
            triton = bar.get(concurrency)
            lines.append(f"| {mode} | {concurrency} | {statistics.median(r['calls_s'] for r in rows):.0f} | "
                         f"{statistics.median(r['cpu_us'] for r in rows):.0f} | "
                         f"{'–' if triton is None else f'{triton:.0f}'} |")
    lines += _decision(samples, levels)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grpc-floor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
