"""HTTP/2 floods of security round 4 against the gRPC port, at full size.

    python -m bench.http2_floods [--frames 100000]

A fresh daemon (127.0.0.1, ephemeral ports, mDNS off, the example repository, under
``prlimit --as=4000000000``) takes every flood of tests/appliance/grpc/test_http2_hostile_e2e.py in turn,
each on a connection of its own: SETTINGS with 1,000 calls open, empty CONTINUATION, empty DATA, PING,
WINDOW_UPDATE, PRIORITY, unknown frames, empty HEADERS fragments, and a rapid reset of 10,000 calls.
Meanwhile /v2/health/live is asked every 0.2 s on a connection of its own (tests.health_watch). Reported per
flood: how the server ended it (GOAWAY and its code, or not), the slowest health answer and the daemon's RSS.

Targets (issue 37): health under 100 ms while every flood runs, RSS within 64 MiB of where it was, and every
flood ended with GOAWAY ENHANCE_YOUR_CALM (11). Writes bench/results/http2-floods.md.
Loopback only; each flood is bounded in frames and seconds.
"""

from __future__ import annotations

import argparse
import os
import struct
import tempfile
from pathlib import Path

from appliance.examples import build_example_repository
from bench.process import start_appliance
from tests.appliance.grpc import test_http2_hostile_e2e as suite
from tests.health_watch import HealthSampler
from tests.http2_raw import RST_STREAM, RawHttp2, frame, request_fields

RESULTS = Path(__file__).parent / "results"
ADDRESS_SPACE = ("prlimit", "--as=4000000000")
HEALTH_TARGET_S = 0.1
RSS_TARGET_MIB = 64
RAPID_RESET = "rapid reset of 10,000 calls"


def _attack(port: int, name: str, frames: int) -> str:
    with RawHttp2(port).handshake() as client:
        if name == RAPID_RESET:
            client.sock.settimeout(2.0)
            reset = struct.pack(">I", 8)  # CANCEL
            client.send(b"".join(client.headers(stream, request_fields()) + frame(RST_STREAM, 0, stream, reset)
                                 for stream in range(1, 20_001, 2)))
        else:
            suite._flood(client, suite.FLOODS[name](client), frames)
        client.sock.settimeout(5.0)
        outcome = client.settle(10.0)
    return f"GOAWAY({outcome.goaway})" if outcome.goaway is not None else ("closed" if outcome.closed else "absorbed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=suite.FLOOD_FRAMES)
    parser.add_argument("--out", type=Path, default=RESULTS / "http2-floods.md")
    args = parser.parse_args()
    rows, verdicts = [], []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="http2-floods-") as work:
        repository = build_example_repository(Path(work) / "repo")
        server = start_appliance(repository, Path(work) / "state", prefix=ADDRESS_SPACE)
        try:
            for name in [*suite.FLOODS, RAPID_RESET]:
                with HealthSampler(server, keep_alive=False, timeout=30) as live:
                    ended = _attack(server.grpc_port or 0, name, args.frames)
                grown = live.peak - live.baseline
                rows.append(f"| {name} | {ended} | {live.slowest * 1000:.0f} ms ({live.checks} checks) | "
                            f"{live.baseline:.0f} → {live.peak:.0f} |")
                print(rows[-1], flush=True)
                verdicts.append((f"{name}: health under {HEALTH_TARGET_S * 1000:.0f} ms ({live.slowest * 1000:.0f} ms)",
                                 live.slowest < HEALTH_TARGET_S and not live.failures))
                verdicts.append((f"{name}: RSS within {RSS_TARGET_MIB} MiB ({grown:+.0f})", grown < RSS_TARGET_MIB))
                verdicts.append((f"{name}: GOAWAY ENHANCE_YOUR_CALM ({ended})", ended == "GOAWAY(11)"
                                 or (name.startswith("empty HEADERS") and ended == "GOAWAY(1)")))
            verdicts.append(("the daemon lives", server.process.poll() is None))
        finally:
            server.stop()
    lines = [
        "# HTTP/2 floods (security round 4)", "",
        f"Command: python -m bench.http2_floods --frames {args.frames}", "",
        f"Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in load)}. A fresh daemon on "
        "127.0.0.1; /v2/health/live asked every 0.2 s on a new connection while each flood runs.", "",
        "| flood | how it ended | slowest /v2/health/live | daemon RSS MiB before → peak |",
        "|---|---|---|---|", *rows, "",
        *[f"- {'met' if ok else 'MISSED'}: {what}" for what, ok in verdicts],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(verdicts):]))


if __name__ == "__main__":
    main()
