"""A box serving HTTP and gRPC over TLS, on the LAN of a private network namespace (see test_fleet_tls.py);
prints what it saw as JSON on its last line.

The box is discovered (its record's ``tls``), pinned with `appliance fleet trust NAME` (the certificate it
presents), read by `appliance fleet` over TLS; restarted at the same address with another certificate it
is refused by `appliance fleet` and `appliance push`; restarted without TLS, it is refused too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trustme

from appliance.client.boxes import discover
from appliance.tls.certificate import fingerprint
from tests.appliance.mdns.fleet_scenario import LOOPBACK, cli, wait_started
from tests.appliance.mdns.scenario import stop_all
from tests.builders import identity_model, write_model

NAME = "box-tls"


def _certificate(directory: Path) -> tuple[list[str], str]:
    """The flags that serve a new certificate on both ports, and its fingerprint."""
    directory.mkdir(parents=True)
    issued = trustme.CA().issue_cert(LOOPBACK)
    cert, key = directory / "server.pem", directory / "server.key"
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    key.chmod(0o600)
    flags = []
    for port in ("http", "grpc"):
        flags += [f"--{port}-use-ssl=true", f"--{port}-server-cert", str(cert), f"--{port}-server-key", str(key)]
    return flags, fingerprint(cert.read_bytes())


def _launch(work: Path, port: int, *flags: str) -> tuple[subprocess.Popen, int]:
    state, log = work / "state", work / f"daemon-{time.monotonic_ns()}.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
             "--host", LOOPBACK, "--http-port", str(port), "--grpc-port",
             "0", "--no-selection", "--state-dir", str(state), "--model-repository", str(work / "repo"), "--name",
             NAME, "--mdns-interface", LOOPBACK, *flags],
            stdout=output, stderr=subprocess.STDOUT, env=dict(os.environ))
    return process, wait_started(process, log)


def _run(command: subprocess.CompletedProcess) -> dict:
    return {"rc": command.returncode, "stdout": command.stdout, "stderr": command.stderr}


def _fleet_row(find: tuple[str, ...], until: str) -> dict:
    """`appliance fleet --json`'s row for the box, once ``until`` is in it (the LAN has the new record)."""
    deadline = time.monotonic() + 20
    while True:
        rows = [row for row in json.loads(cli("fleet", "--json", *find).stdout) if row["name"] == NAME]
        if (rows and until in json.dumps(rows[0])) or time.monotonic() > deadline:
            return rows[0] if rows else {}


def main() -> None:
    work = Path(tempfile.mkdtemp())
    os.environ["APPLIANCE_TRUSTED_BOXES"] = str(work / "trusted-boxes.json")
    write_model(work / "repo", "identity", identity_model(["FP32"]))
    write_model(work / "pushed", "extra", identity_model(["FP32"]))
    find = ("--mdns-interface", LOOPBACK, "--timeout", "3")
    result: dict = {}
    processes: list[subprocess.Popen] = []
    try:
        first, result["first"] = _certificate(work / "first")
        second, result["second"] = _certificate(work / "second")
        process, port = _launch(work, 0, *first)
        processes.append(process)
        result["port"] = port
        (box,) = [b for b in discover(3, (LOOPBACK,)) if b.name == NAME]
        result["discovered"] = {"tls": list(box.tls), "url": box.base_url}
        result["discover_table"] = cli("discover", *find).stdout
        result["trust"] = _run(cli("fleet", "trust", NAME, *find))
        result["pins"] = json.loads((work / "trusted-boxes.json").read_text())
        result["fleet_pinned"] = _fleet_row(find, "pinned")

        process.terminate()
        process.wait(30)
        process, _ = _launch(work, port, *second)  # the same box (state dir), address and port
        processes.append(process)
        result["fleet_changed"] = _fleet_row(find, "presents the TLS certificate")
        result["push_changed"] = _run(cli("push", str(work / "pushed" / "extra"), "--to", NAME, *find))

        process.terminate()
        process.wait(30)
        process, _ = _launch(work, port)  # the same box, in plain HTTP
        processes.append(process)
        result["fleet_plain"] = _fleet_row(find, "plain HTTP")
        result["push_plain"] = _run(cli("push", str(work / "pushed" / "extra"), "--to", NAME, *find))
    finally:
        stop_all(processes, work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
