"""A real box and a fake one on the LAN, inside a private network namespace (see test_fleet_trust.py);
prints what it saw as JSON on its last line.

box-real is a daemon that exempts no address and protects inference (every request but health needs
the token: a signature from the CLI, the bearer token from a BoxPool). The fake box is an HTTP server
that logs every request it receives (line, headers, body) and announces itself over mDNS twice: as
"box-fake" with an id of its own, and as "box-imp" with the real box's id (an impostor). It plays the
strongest part it can: asked for a nonce, it fetches one from the real box and hands it on (so that
anything signed for it would carry a nonce the real box issued), and it answers every other request
200. Afterwards it replays everything it received to the real box.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from zeroconf import IPVersion, ServiceInfo, Zeroconf

from appliance.client import BoxPool
from appliance.client.boxes import KSERVE_TYPE
from tests.appliance.mdns.fleet_scenario import LOOPBACK, call, cli, launch, model_dirs, tensor, wait_started
from tests.appliance.mdns.scenario import stop_all
from tests.waiting import wait_until

TOKEN = "fleet-token-0123456789-abcdefghij"
FAKE_ID = "fa4ebeef-0000-4000-8000-000000000000"


class FakeBox:
    """Logs every request; relays the real box's nonces; announces box-fake and box-imp."""

    def __init__(self, real_port: int, real_id: str) -> None:
        self.seen: list[dict] = []
        self.raw: list[tuple[str, str, dict, bytes]] = []
        self.real_port = real_port
        self.real_id = real_id
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()}
                fake.seen.append({"method": self.command, "path": self.path, "headers": headers,
                                  "body_bytes": len(body)})
                fake.raw.append((self.command, self.path, headers, body))
                if self.path == "/v2/fleet/nonce":
                    status, relayed = call(fake.real_port, "GET", "/v2/fleet/nonce")
                    reply = json.dumps({"id": FAKE_ID, "nonce": relayed["nonce"], "expires_in": 60,  # type: ignore[index]
                                        "scheme": "Fleet"}).encode()
                elif self.path == "/v2/repository/index" or self.path.startswith("/v2/history"):
                    reply = b"[]" if "index" in self.path else b'{"series": {"requests": []}}'
                else:
                    reply = b'{"name": "fake", "version": "0.1.0"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.zeroconf = Zeroconf(interfaces=[LOOPBACK], ip_version=IPVersion.V4Only)
        for name, box_id in (("box-fake", FAKE_ID), ("box-imp", real_id)):
            self.zeroconf.register_service(ServiceInfo(
                KSERVE_TYPE, f"{name}.{KSERVE_TYPE}", addresses=[socket.inet_aton(LOOPBACK)], port=self.port,
                properties={"txtvers": "1", "id": box_id, "version": "0.1.0", "api": "v2", "path": "/v2",
                            "hw": "cpu", "models": "0"},
                server=f"{name}.local."))

    def close(self) -> None:
        self.zeroconf.unregister_all_services()
        self.zeroconf.close()
        self.server.shutdown()
        self.server.server_close()

    def replay(self) -> list[dict]:
        """Every request received, sent to the real box as it came (headers and body), and its answer."""
        answers = []
        for method, path, headers, body in self.raw:
            sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
            connection = http.client.HTTPConnection(LOOPBACK, self.real_port, timeout=30)
            try:
                connection.request(method, path, body=body or None, headers=sent)
                response = connection.getresponse()
                answers.append({"method": method, "path": path, "status": response.status,
                                "signed": "Authorization" in headers, "answer": response.read()[:200].decode()})
            finally:
                connection.close()
            if "Authorization" in headers:  # and with the id it was signed for changed to the real box's
                forged = headers["Authorization"].replace(FAKE_ID, self.real_id)
                status, _ = _request(self.real_port, method, path, body, {**sent, "Authorization": forged})
                answers.append({"method": method, "path": path, "status": status, "signed": True, "forged": True})
        return answers


def _request(port: int, method: str, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def pool_requests(pins: Path | None) -> dict:
    """A BoxPool with the token, following the LAN: with the pins file it sends the token to box-real;
    without, to no box it merely found (so box-real, which protects inference, serves it nothing)."""
    with BoxPool(interfaces=(LOOPBACK,), token=TOKEN, trusted_boxes=pins, retry_deadline=2) as pool:
        with contextlib.suppress(AssertionError):  # the answers below say what is missing
            wait_until(lambda: (pool.stats().get("box-real", {}).get("models")
                                or pool.stats().get("box-real", {}).get("index_error")), timeout=20,
                       what="box-real's models (or its index error)", interval=0.1)
        answers = []
        for value in range(5):
            try:
                answers.append(float(pool.infer("n", [tensor("n", value)]).as_numpy("y")[0, 0]))
            except Exception as exc:  # noqa: BLE001 - recorded
                answers.append(f"{type(exc).__name__}: {exc}"[:300])
        return {"answers": answers, "stats": pool.stats()}


def _run(command: subprocess.CompletedProcess) -> dict:
    return {"rc": command.returncode, "stdout": command.stdout, "stderr": command.stderr}


def _models(port: int) -> list[str]:
    """The real box's models (it protects inference: the scenario reads it as its operator, with the token)."""
    status, raw = _request(port, "POST", "/v2/repository/index", b"{}",
                           {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert status == 200, raw
    return sorted(row["name"] for row in json.loads(raw))


def main() -> None:
    work = Path(tempfile.mkdtemp())
    result: dict = {}
    processes: dict[str, subprocess.Popen] = {}
    fake: FakeBox | None = None
    os.environ["APPLIANCE_TRUSTED_BOXES"] = str(work / "trusted-boxes.json")
    token_file = work / "fleet-token"
    token_file.write_text(TOKEN + "\n")
    secure = {"APPLIANCE_AUTH_TOKEN": TOKEN, "APPLIANCE_AUTH_EXEMPT_NETWORKS": "",
              "APPLIANCE_PROTECT_INFERENCE": "true"}
    find = ("--mdns-interface", LOOPBACK, "--timeout", "3")
    try:
        process, log = launch("box-real", work, env=secure)
        processes["box-real"] = process
        port = wait_started(process, log)
        real_id = (work / "state-box-real" / "device-id").read_text().strip()
        result.update(real_id=real_id, real_port=port)
        fake = FakeBox(port, real_id)
        result["fake_port"] = fake.port
        m_dir, n_dir = model_dirs(work)
        token = ("--token-file", str(token_file))

        result["trust_real"] = _run(cli("fleet", "trust", "box-real", *find))
        result["push_all"] = _run(cli("push", str(n_dir), "--all", *token, *find))
        result["fleet"] = _run(cli("fleet", "--json", *token, *find))
        result["pool_pinned"] = pool_requests(work / "trusted-boxes.json")
        result["pool_unpinned"] = pool_requests(None)
        result["seen_before_pinning"] = list(fake.seen)
        # The operator's mistake: pinning the fake box. It now gets signed requests, for its own id.
        result["trust_fake"] = _run(cli("fleet", "trust", "box-fake", *find))
        result["push_fake"] = _run(cli("push", str(m_dir), "--to", "box-fake", "--name", "stolen", *token, *find))
        result["seen"] = list(fake.seen)
        result["replayed"] = fake.replay()
        result["real_models"] = _models(port)

        # The real box moves (a new port after a restart): not trusted until pinned again.
        process.terminate()
        process.wait(30)
        (work / "state-box-real" / "daemon.log").unlink()
        restarted, log = launch_again("box-real", work, secure)
        processes["box-real"] = restarted
        new_port = wait_started(restarted, log)
        result["new_port"] = new_port
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the LAN has the new record (the old one said goodbye)
            moved = cli("push", str(n_dir), "--to", "box-real", "--name", "moved", *token, *find)
            if f":{new_port}" in moved.stdout:
                break
        result["push_moved"] = _run(moved)
        result["trust_again"] = _run(cli("fleet", "trust", "box-real", *find))
        result["push_again"] = _run(cli("push", str(n_dir), "--to", "box-real", "--name", "moved", *token, *find))
        result["real_models_after"] = _models(new_port)
    finally:
        if fake is not None:
            fake.close()
        stop_all(processes.values(), work)
    print(json.dumps(result))


def launch_again(name: str, work: Path, env: dict) -> tuple[subprocess.Popen, Path]:
    """The same box (state dir: its id, token and pushed models) started again, on a new port."""
    state, repo = work / f"state-{name}", work / f"repo-{name}"
    log = state / "daemon.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
             "--host", LOOPBACK, "--http-port", "0", "--grpc-port", "0",
             "--no-selection", "--state-dir", str(state), "--model-repository", str(repo), "--name", name,
             "--mdns-interface", LOOPBACK],
            stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **env})
    return process, log


if __name__ == "__main__":
    main()
