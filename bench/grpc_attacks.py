"""The gRPC attacks of security round 3 at their original sizes, against a daemon on 127.0.0.1.

    python -m bench.grpc_attacks [--bomb-mib 200] [--calls 10] [--rounds 3] [--stream-mib 30]
                                 [--stream-requests 100] [--connections 3000]

Each attack gets a fresh daemon (127.0.0.1, ephemeral ports, mDNS off, the example repository in
explicit mode), run under ``prlimit --as=4000000000`` (``--nofile=2048`` for the connection flood) as
the issue ran it, and reports the answers, the daemon's resident memory before and at its peak (VmHWM),
the slowest ``/v2/health/live`` answer seen while it ran (polled every 0.2 s), and whether the daemon
lived:

1. ``--rounds`` × ``--calls`` concurrent ModelInfer calls of ``--bomb-mib`` MiB without the token
   (``protect_inference``, no exempt networks): refused before a byte of them is read.
2. The same calls with the default settings (loopback needs no token): received within the receive
   slots and the memory budget (the worst case is about twice ``max_request_memory_bytes``; see
   docs/security.md "The gRPC port").
3. One ModelStreamInfer stream of ``--stream-requests`` requests of ``--stream-mib`` MiB with a
   ``sequence_id``: counted when read, the stream paused at ``grpc_stream_max_pending``.
4. ``--connections`` idle TCP connections to the gRPC port (each sends the HTTP/2 preface), then an
   HTTP health check and a model load: the connection cap and the descriptor reserve.

Targets: the daemon lives through every attack; without the token RSS grows by less than 64 MiB; the
live check answers within 5 s throughout (these requests are 200 MiB each on a 2-core box); with the
defaults the peak stays under three times the budget. Writes bench/results/grpc-attacks.md. Loopback
only, bounded in count and time; the client holds one bomb's bytes at a time per call in flight.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2 as pb

from appliance.examples import build_example_repository
from bench.process import Server, peak_rss_mib, rss_mib, start_appliance
from tests import grpc_util
from tests.health_watch import HealthSampler
from tests.http_util import call, open_sockets

RESULTS = Path(__file__).parent / "results"
ADDRESS_SPACE = ("prlimit", "--as=4000000000")
DEFAULT_BUDGET_MIB = 1024
def _unary_bombs(server: Server, size: int, calls: int, rounds: int) -> str:
    bomb = grpc_util.bomb("simple", size)
    codes: Counter = Counter()
    with grpc_util.channel(server.grpc_port or 0) as channel:
        infer = channel.unary_unary(grpc_util.MODEL_INFER)
        for _ in range(rounds):
            codes.update(grpc_util.codes([infer.future(bomb, timeout=120) for _ in range(calls)]))
    return ", ".join(f"{count} {code}" for code, count in sorted(codes.items()))


def _stream_bombs(server: Server, size: int, requests: int) -> str:
    bomb = grpc_util.bomb("simple", size, sequence_id=7)
    answers: list[pb.ModelStreamInferResponse] = []
    with grpc_util.channel(server.grpc_port or 0) as channel:
        stream = channel.stream_stream(grpc_util.MODEL_STREAM_INFER,
                                       response_deserializer=pb.ModelStreamInferResponse.FromString)
        try:
            answers.extend(stream(iter([bomb] * requests), timeout=300))
        except grpc.RpcError as error:
            return f"{len(answers)} answers, then {error.code().name}"
    refused = sum(1 for answer in answers if answer.error_message)
    return f"{len(answers)} answers ({refused} of them errors)"


def _connection_flood(server: Server, count: int) -> str:
    refused = 0
    with open_sockets() as opened:
        for _ in range(count):
            try:
                sock = socket.create_connection(("127.0.0.1", server.grpc_port or 0), timeout=5)
            except OSError:
                refused += 1
                continue
            opened.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(grpc_util.PREFACE)
        time.sleep(3)
        descriptors = len(os.listdir(f"/proc/{server.process.pid}/fd"))
        ready = call(server.port, "GET", "/v2/health/ready")[0]
        load = call(server.port, "POST", "/v2/repository/models/simple/load", {})[0]
    return (f"{len(opened)} open ({refused} refused): daemon at {descriptors}/2048 descriptors, "
            f"HTTP ready {ready}, a model load {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bomb-mib", type=int, default=200)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-mib", type=int, default=30)
    parser.add_argument("--stream-requests", type=int, default=100)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=RESULTS / "grpc-attacks.md")
    args = parser.parse_args()

    load_before = os.getloadavg()
    attacks = [
        (f"{args.rounds} × {args.calls} concurrent {args.bomb_mib} MiB ModelInfer calls without the token "
         "(protect_inference, no exempt networks)",
         {"APPLIANCE_PROTECT_INFERENCE": "true", "APPLIANCE_AUTH_EXEMPT_NETWORKS": ""}, ADDRESS_SPACE,
         lambda server: _unary_bombs(server, args.bomb_mib << 20, args.calls, args.rounds)),
        (f"the same {args.rounds} × {args.calls} calls, default settings", {}, ADDRESS_SPACE,
         lambda server: _unary_bombs(server, args.bomb_mib << 20, args.calls, args.rounds)),
        (f"one stream of {args.stream_requests} × {args.stream_mib} MiB requests with a sequence_id, default "
         "settings", {}, ADDRESS_SPACE,
         lambda server: _stream_bombs(server, args.stream_mib << 20, args.stream_requests)),
        (f"{args.connections} idle connections to the gRPC port", {}, ("prlimit", "--nofile=2048"),
         lambda server: _connection_flood(server, args.connections)),
    ]
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory(prefix="grpc-attacks-") as work:
        repository = build_example_repository(Path(work) / "repo")
        for index, (name, env, prefix, attack) in enumerate(attacks):
            server = start_appliance(repository, Path(work) / f"state-{index}", "--model-control-mode", "explicit",
                                     "--load-model", "*", env=env, prefix=prefix)
            try:
                with HealthSampler(server, keep_alive=False, timeout=30) as live:
                    answers = attack(server)
                alive = server.process.poll() is None
                before = live.baseline
                now, peak = (rss_mib(server.process.pid), peak_rss_mib(server.process.pid)) if alive else (0.0, 0.0)
            finally:
                server.stop()
            worst = 30.0 if live.failures else live.slowest
            rows.append(f"| {name} | {answers} | {before:.0f} → {peak:.0f} (after: {now:.0f}) | "
                        f"{worst * 1000:.0f} ms | {'lived' if alive else 'DIED'} |")
            print(rows[-1], flush=True)
            verdicts.append((f"{name}: the daemon lives", alive))
            verdicts.append((f"{name}: /v2/health/live within 5 s ({worst:.1f} s)", worst < 5))
            if index == 0:
                grown = peak - before
                verdicts.append((f"{name}: RSS grows by less than 64 MiB ({grown:+.0f} MiB)", grown < 64))
            if index == 1:
                verdicts.append((f"{name}: peak under three times the 1 GiB budget ({peak:.0f} MiB)",
                                 peak < 3 * DEFAULT_BUDGET_MIB))
    load_after = os.getloadavg()

    lines = [
        "# gRPC attacks (security round 3) at their original sizes",
        "",
        f"Command: python -m bench.grpc_attacks --bomb-mib {args.bomb_mib} --calls {args.calls} --rounds "
        f"{args.rounds} --stream-mib {args.stream_mib} --stream-requests {args.stream_requests} --connections "
        f"{args.connections}",
        "",
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{', '.join(f'{x:.2f}' for x in load_after)}. Each attack against a fresh daemon on 127.0.0.1.",
        "",
        "| attack | answers | daemon RSS MiB before → peak | slowest /v2/health/live | daemon |",
        "|---|---|---|---|---|",
        *rows,
        "",
        *[f"- {'met' if ok else 'MISSED'}: {what}" for what, ok in verdicts],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(verdicts):]))


if __name__ == "__main__":
    main()
