"""Fleet pinning over TLS, end to end: `appliance fleet trust --url https://...` records the certificate the
box presents (its SHA-256 fingerprint) with its id; the fleet commands then talk TLS to the box and read
it; the same box restarted with another certificate is refused by `appliance fleet` and `appliance push`
(nothing is sent: the push loads nothing), even through an http:// URL; --fingerprint pins only the
certificate named. Certificates come from trustme."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.builders import identity_model, write_model
from tests.tls_util import Pki, wait_until_loaded


def _appliance(pins: Path, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    environment["APPLIANCE_TRUSTED_BOXES"] = str(pins)
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=120,
                          env=environment)


def _index(daemon, served: Pki) -> list[str]:
    context = served.context()
    request = urllib.request.Request(f"https://{daemon.url}/v2/repository/index", data=b"{}")
    return [row["name"] for row in json.loads(urllib.request.urlopen(request, timeout=10, context=context).read())]


def test_a_pinned_box_presenting_another_certificate_is_refused(start_daemon, tmp_path):
    repository, pushed = tmp_path / "repo", tmp_path / "pushed"
    write_model(repository, "identity", identity_model(["FP32"]))
    write_model(pushed, "extra", identity_model(["FP32"]))
    pins, state = tmp_path / "pins.json", tmp_path / "state"
    first, second = Pki(tmp_path / "first"), Pki(tmp_path / "second")
    daemon = start_daemon(repository, *first.flags("http"), "--no-grpc", state=state, wait_loaded=False)
    wait_until_loaded(daemon, first)
    url = f"https://{daemon.url}"

    wrong = _appliance(pins, "fleet", "trust", "--url", url, "--fingerprint", second.fingerprint)
    assert wrong.returncode == 1 and f"presents the TLS certificate {first.fingerprint}" in wrong.stdout, wrong
    assert not pins.exists() or json.loads(pins.read_text())["boxes"] == []

    pinned = _appliance(pins, "fleet", "trust", "--url", url, "--fingerprint", first.fingerprint.replace(":", ""))
    assert pinned.returncode == 0, pinned
    assert f"TLS certificate SHA-256 {first.fingerprint}" in pinned.stdout
    (pin,) = json.loads(pins.read_text())["boxes"]
    assert pin["fingerprint"] == first.fingerprint and pin["port"] == daemon.port
    read = _appliance(pins, "fleet", "--url", url, "--json")
    (row,) = json.loads(read.stdout)
    assert row["error"] is None and row["models_ready"] == 1 and row["url"] == url, read

    # The same box (its state dir: the same id) at the same address, now with another certificate.
    port = daemon.port
    assert daemon.stop() == 0
    daemon = start_daemon(repository, *second.flags("http"), "--no-grpc", "--http-port", str(port), state=state,
                          wait_loaded=False)
    wait_until_loaded(daemon, second)
    assert daemon.port == port
    for given in (url, f"http://{daemon.url}"):  # a plain URL does not talk the box out of its pinned TLS
        listed = _appliance(pins, "fleet", "--url", given, "--json")
        (row,) = json.loads(listed.stdout)
        assert row["trust"] == "CHANGED" and row["models_ready"] is None, listed
        assert f"presents the TLS certificate {second.fingerprint}, but it was pinned with " \
               f"{first.fingerprint}" in row["error"]
        push = _appliance(pins, "push", str(pushed / "extra"), "--url", given)
        assert push.returncode == 1 and "not pushed" in push.stdout and "appliance fleet trust" in push.stdout, push
    assert _index(daemon, second) == ["identity"]  # nothing was sent: nothing loaded

    again = _appliance(pins, "fleet", "trust", "--url", url)
    assert again.returncode == 0 and second.fingerprint in again.stdout, again
    push = _appliance(pins, "push", str(pushed / "extra"), "--url", url)
    assert push.returncode == 0, push
    assert sorted(_index(daemon, second)) == ["extra", "identity"]


@pytest.mark.parametrize("tls", [False, True])
def test_trusted_lists_the_pinned_certificate(start_daemon, tmp_path, tls):
    repository, pins = tmp_path / "repo", tmp_path / "pins.json"
    write_model(repository, "identity", identity_model(["FP32"]))
    served = Pki(tmp_path / "pki")
    if tls:
        daemon = start_daemon(repository, *served.flags("http"), "--no-grpc", wait_loaded=False)
        wait_until_loaded(daemon, served)
    else:
        daemon = start_daemon(repository, "--no-grpc")
    assert _appliance(pins, "fleet", "trust", "--url", f"{'https' if tls else 'http'}://{daemon.url}").returncode == 0
    (listed,) = json.loads(_appliance(pins, "fleet", "trusted", "--json").stdout)
    assert listed["fingerprint"] == (served.fingerprint if tls else None)
    table = _appliance(pins, "fleet", "trusted").stdout
    assert (served.fingerprint if tls else "- (plain HTTP)") in table
