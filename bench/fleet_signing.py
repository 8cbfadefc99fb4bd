"""What signed requests cost (appliance.security.fleet_signature: the fleet proves the token without sending it),
beside the bearer token they replace for `appliance push` and `appliance fleet`.

    python -m bench.fleet_signing [--reads 300] [--pushes 10]

- In process: verifying one signed request (nonce issued, header parsed, tag, age, HMAC, reuse) and
  checking one bearer token, median µs over batches.
- Against a daemon (127.0.0.1, ephemeral ports, mDNS off) that exempts no address and protects
  inference, so every request needs a credential: a read (GET /v2/models/stats) with the bearer token
  and signed (a nonce from GET /v2/fleet/nonce, then the request, on one keep-alive connection, as
  `appliance fleet` does); and a push of a CNN (Triton's load API with file overrides) both ways, as
  `appliance push` does. Interleaved, medians; the load average is recorded.

Targets: a signature verifies in at most 100 µs; a signed read costs at most one extra round trip
(at most 2 ms more than the bearer read here); a signed push at most 5 % (or 10 ms) more than a bearer
push. Writes bench/results/fleet-signing.md.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from appliance.protocol.admission import check_bearer
from appliance.security.fleet_signature import FleetVerifier, sign
from bench.models import cnn_model, write_repository
from bench.process import Server, start_appliance

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-token-0123456789-abcdefghij"


def _per_call_us(call, batches: int = 20, per_batch: int = 500) -> float:
    times = []
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(per_batch):
            call()
        times.append((time.perf_counter() - started) / per_batch * 1e6)
    return statistics.median(times)


def in_process() -> dict[str, float]:
    verifier = FleetVerifier(TOKEN, "8d5a3c1e-1111-4222-8333-944445555666", max_used=1 << 30)

    def signed() -> None:
        nonce = verifier.nonce()
        verifier.verify(sign(TOKEN, verifier.box_id, nonce, "GET", "/v2/models/stats"), "GET", "/v2/models/stats")

    signed_ahead = iter([sign(TOKEN, verifier.box_id, verifier.nonce(), "GET", "/v2/models/stats")
                         for _ in range(10_000)])
    verify = _per_call_us(lambda: verifier.verify(next(signed_ahead), "GET", "/v2/models/stats"))
    return {"verify_us": verify, "nonce_sign_verify_us": _per_call_us(signed),
            "bearer_us": _per_call_us(lambda: check_bearer(f"Bearer {TOKEN}", TOKEN, "x"))}


class _Client:
    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
        self.connection.request(method, path, body=body, headers=headers or {})
        response = self.connection.getresponse()
        return response.status, response.read()

    def signed(self, method: str, path: str, body: bytes | None = None) -> int:
        status, raw = self.call("GET", "/v2/fleet/nonce")
        answer = json.loads(raw)
        header = sign(TOKEN, answer["id"], answer["nonce"], method, path, body or b"")
        headers = {"Authorization": header, "Content-Type": "application/json"}
        return self.call(method, path, body, headers)[0]

    def bearer(self, method: str, path: str, body: bytes | None = None) -> int:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        return self.call(method, path, body, headers)[0]


def against_daemon(server: Server, reads: int, pushes: int, model: bytes) -> dict[str, list[float]]:
    client = _Client(server.port)
    samples: dict[str, list[float]] = {"read bearer": [], "read signed": [], "push bearer": [], "push signed": []}
    for index in range(reads):
        for how in ("bearer", "signed") if index % 2 else ("signed", "bearer"):
            started = time.perf_counter()
            status = getattr(client, how)("GET", "/v2/models/stats")
            samples[f"read {how}"].append((time.perf_counter() - started) * 1000)
            assert status == 200, status
    body = json.dumps({"parameters": {"config": json.dumps({"backend": "onnxruntime", "max_batch_size": 16}),
                                      "file:1/model.onnx": base64.b64encode(model).decode()}}).encode()
    for index in range(pushes):
        for how in ("bearer", "signed") if index % 2 else ("signed", "bearer"):
            started = time.perf_counter()
            status = getattr(client, how)("POST", f"/v2/repository/models/pushed_{how}/load", body)
            samples[f"push {how}"].append((time.perf_counter() - started) * 1000)
            assert status == 200, status
    samples["push body bytes"] = [float(len(body))]
    return samples


def report(args: argparse.Namespace, local: dict[str, float], remote: dict[str, list[float]], loads: tuple) -> str:
    med = {k: statistics.median(v) for k, v in remote.items()}
    read_extra = med["read signed"] - med["read bearer"]
    push_extra = med["push signed"] - med["push bearer"]
    lines = [
        f"Command: python -m bench.fleet_signing --reads {args.reads} --pushes {args.pushes}", "",
        f"Load average (1, 5, 15 min) before and after: {loads[0]} / {loads[1]}", "",
        "| measure | median |", "|---|---|",
        f"| verify one signed request (in process) | {local['verify_us']:.1f} µs |",
        f"| issue a nonce, sign, verify (in process) | {local['nonce_sign_verify_us']:.1f} µs |",
        f"| check one bearer token (in process) | {local['bearer_us']:.2f} µs |",
        f"| read, bearer (GET /v2/models/stats) | {med['read bearer']:.2f} ms |",
        f"| read, signed (nonce + request, one connection) | {med['read signed']:.2f} ms ({read_extra:+.2f} ms) |",
        f"| push of {med['push body bytes'] / 1e3:.0f} kB (CNN), bearer | {med['push bearer']:.1f} ms |",
        f"| push, signed | {med['push signed']:.1f} ms ({push_extra:+.1f} ms, "
        f"{(med['push signed'] / med['push bearer'] - 1) * 100:+.1f} %) |",
        "", "Targets:",
        f"- {'met' if local['verify_us'] <= 100 else 'MISSED'}: a signature verifies in at most 100 µs "
        f"({local['verify_us']:.1f} µs)",
        f"- {'met' if read_extra <= 2.0 else 'MISSED'}: a signed read costs at most 2 ms more ({read_extra:+.2f} ms)",
        f"- {'met' if push_extra <= max(10.0, 0.05 * med['push bearer']) else 'MISSED'}: a signed push costs at most "
        f"5 % or 10 ms more ({push_extra:+.1f} ms)",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300, help="reads of each kind (default 300)")
    parser.add_argument("--pushes", type=int, default=10, help="pushes of each kind (default 10)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    before = tuple(round(x, 2) for x in os.getloadavg())
    local = in_process()
    work = Path(tempfile.mkdtemp(prefix="fleet-signing-"))
    repo = write_repository(work / "repo")
    os.environ.update({"APPLIANCE_AUTH_TOKEN": TOKEN, "APPLIANCE_AUTH_EXEMPT_NETWORKS": "",
                       "APPLIANCE_PROTECT_INFERENCE": "true"})
    server = start_appliance(repo, work / "state", "--no-selection", "--no-grpc")
    try:
        made = cnn_model()
        made.ir_version = 8
        remote = against_daemon(server, args.reads, args.pushes, made.SerializeToString())
    finally:
        server.stop()
    text = report(args, local, remote, (before, tuple(round(x, 2) for x in os.getloadavg())))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet-signing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
