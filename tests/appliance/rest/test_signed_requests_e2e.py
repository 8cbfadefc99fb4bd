"""Signed requests end to end: a client proves the token without sending it (GET /v2/fleet/nonce, then
Authorization: Fleet ...), the box takes each signature once, for its own id, the request and the body
signed; the bearer token keeps working for every other client. `appliance push` and `appliance fleet`
sign, and what they put on the wire is no use to whoever records it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.security.fleet_signature import sign
from tests.builders import affine_model, save, write_model
from tests.http_util import call
from tests.relay import relay

TOKEN = "fleet-token-0123456789-abcdefghij"
REMOTE = "127.0.0.2"  # looks remote to a daemon that exempts only 127.0.0.1
ROOT = Path(__file__).resolve().parents[3]
LOAD = "/v2/repository/models/tripler/load"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("signed")
    write_model(root / "repo", "affine", affine_model(2, 0))
    directory = root / "push" / "tripler"
    save(affine_model(3, 0), directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    (root / "token").write_text(TOKEN + "\n")
    return root


@pytest.fixture(scope="module")
def box(module_daemon, files, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    daemon = module_daemon(files / "repo", state=state, env={"APPLIANCE_AUTH_TOKEN": TOKEN,
                                                             "APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"})
    daemon.extra["id"] = (state / "device-id").read_text().strip()
    return daemon


def _load_body(files: Path) -> bytes:
    import base64

    model = (files / "push" / "tripler" / "1" / "model.onnx").read_bytes()
    return json.dumps({"parameters": {"config": json.dumps({"backend": "onnxruntime", "max_batch_size": 8}),
                                      "file:1/model.onnx": base64.b64encode(model).decode()}}).encode()


def _nonce(port: int) -> dict:
    status, headers, answer = call(port, "GET", "/v2/fleet/nonce", source=REMOTE)
    assert status == 200 and headers["Cache-Control"] == "no-store", answer
    return answer


def _signed(port: int, method: str, path: str, body: bytes = b"", box_id: str | None = None,
            token: str = TOKEN) -> tuple[int, str]:
    answer = _nonce(port)
    header = sign(token, box_id or answer["id"], answer["nonce"], method, path, body)
    status, _, reply = call(port, method, path, body or None, source=REMOTE,
                            headers={"Authorization": header, "Content-Type": "application/json"})
    return status, header


def _models(port: int) -> set[str]:
    status, _, rows = call(port, "POST", "/v2/repository/index", b"{}", headers={"Content-Type": "application/json"})
    assert status == 200
    return {row["name"] for row in rows}


def test_the_nonce_endpoint_needs_no_token_and_names_the_box(box):
    first, second = _nonce(box.port), _nonce(box.port)
    assert first["id"] == second["id"] == box.extra["id"]
    assert first["nonce"] != second["nonce"] and first["scheme"] == "Fleet" and first["expires_in"] == 60


def test_a_signed_push_loads_once_and_its_replay_is_refused(box, files):
    body = _load_body(files)
    status, header = _signed(box.port, "POST", LOAD, body)
    assert status == 200 and "tripler" in _models(box.port)
    call(box.port, "POST", "/v2/repository/models/tripler/unload", b"{}",
         headers={"Content-Type": "application/json"})
    status, _, answer = call(box.port, "POST", LOAD, body, source=REMOTE,
                             headers={"Authorization": header, "Content-Type": "application/json"})
    assert status == 401 and "used already" in answer["error"]
    assert "tripler" not in _models(box.port)


def test_a_signature_does_not_carry_another_body_target_or_box(box, files):
    body = _load_body(files)
    answer = _nonce(box.port)
    header = sign(TOKEN, answer["id"], answer["nonce"], "POST", LOAD, body)
    evil = body + b" "  # the same JSON, as far as a parser goes: but not the bytes signed
    status, _, reply = call(box.port, "POST", LOAD, evil, source=REMOTE,
                            headers={"Authorization": header, "Content-Type": "application/json"})
    assert status == 401 and "not the one its signature covers" in reply["error"]
    answer = _nonce(box.port)
    header = sign(TOKEN, answer["id"], answer["nonce"], "POST", LOAD, body)
    status, _, reply = call(box.port, "POST", "/v2/repository/models/evil/load", body, source=REMOTE,
                            headers={"Authorization": header, "Content-Type": "application/json"})
    assert status == 401 and "does not match" in reply["error"]
    status, _ = _signed(box.port, "POST", LOAD, body, box_id="ffffffff-0000-4000-8000-000000000000")
    assert status == 401
    status, _ = _signed(box.port, "POST", LOAD, body, token="not-the-token-of-this-box-at-all")
    assert status == 401
    assert {"tripler", "evil"}.isdisjoint(_models(box.port))


UNLOAD_BODY = b'{"parameters": {"unload_dependents": false}}'


def _pushed(port: int, files: Path, name: str) -> str:
    """Push ``name`` (from loopback, exempt) and return the path that unloads it."""
    status, _, reply = call(port, "POST", f"/v2/repository/models/{name}/load", _load_body(files),
                            headers={"Content-Type": "application/json"})
    assert status == 200, reply
    return f"/v2/repository/models/{name}/unload"


def _ready(port: int, model: str) -> bool:
    return call(port, "GET", f"/v2/models/{model}/ready")[0] == 200


def _raw(port: int, method: str, path: str, header: str, framing: str, body: bytes = b"") -> bytes:
    """One request from a non-exempt address, its body framed as ``framing`` says; the status line answered."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {header}\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n")
    if framing == "content-length":
        wire = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    elif framing == "chunked":
        chunks = f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b""
        wire = f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"
    else:  # no framing at all: a request without a body
        wire = f"{head}\r\n".encode()
    return _replay(port, wire).split(b"\r\n", 1)[0]


FRAMINGS = ["content-length", "none", "chunked"]


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_signed_request_whose_body_is_stripped_is_refused(box, files, framing):
    """Replayed with Content-Length: 0, with no body at all, or as an empty chunked body, a request signed
    for a body is refused before it acts: an empty body is a body, its digest checked like any other's."""
    name = f"stripped_{framing}"
    unload = _pushed(box.port, files, name)
    answer = _nonce(box.port)
    header = sign(TOKEN, answer["id"], answer["nonce"], "POST", unload, UNLOAD_BODY)
    try:
        assert _raw(box.port, "POST", unload, header, framing) == b"HTTP/1.1 401 Unauthorized"
        assert _ready(box.port, name)
    finally:
        call(box.port, "POST", unload, b"{}", headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_request_signed_without_a_body_is_refused_with_one(box, files, framing):
    name = f"bodiless_{framing}"
    unload = _pushed(box.port, files, name)
    answer = _nonce(box.port)
    header = sign(TOKEN, answer["id"], answer["nonce"], "POST", unload)
    try:
        assert _raw(box.port, "POST", unload, header, framing, UNLOAD_BODY) == b"HTTP/1.1 401 Unauthorized"
        assert _ready(box.port, name)
    finally:
        call(box.port, "POST", unload, b"{}", headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_request_signed_without_a_body_is_taken_without_one(box, files, framing):
    """The happy path of a body-less control request, however the client frames its empty body."""
    name = f"unloaded_{framing}"
    unload = _pushed(box.port, files, name)
    answer = _nonce(box.port)
    header = sign(TOKEN, answer["id"], answer["nonce"], "POST", unload)
    assert _raw(box.port, "POST", unload, header, framing) == b"HTTP/1.1 200 OK"
    assert not _ready(box.port, name)


def test_the_bearer_token_still_works_for_other_clients(box, files):
    headers = {"Content-Type": "application/json"}
    path = "/v2/repository/models/bearer/load"
    status, _, _ = call(box.port, "POST", path, _load_body(files), source=REMOTE,
                        headers={**headers, "Authorization": "Bearer wrong-token-wrong-token-wrong"})
    assert status == 401
    status, _, _ = call(box.port, "POST", path, _load_body(files), source=REMOTE,
                        headers={**headers, "Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "bearer" in _models(box.port)


def test_with_protect_inference_reads_take_a_signature_too(start_daemon, files):
    daemon = start_daemon(files / "repo", env={"APPLIANCE_AUTH_TOKEN": TOKEN, "APPLIANCE_PROTECT_INFERENCE": "true",
                                               "APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"}, wait_loaded=False)
    assert call(daemon.port, "GET", "/v2/models/stats", source=REMOTE)[0] == 401
    assert _signed(daemon.port, "GET", "/v2/models/stats")[0] == 200
    assert _signed(daemon.port, "GET", "/v2/history?step=60")[0] == 200  # the query is signed as sent


def test_a_read_is_refused_unless_its_body_is_the_one_signed(start_daemon, files):
    """A handler that never reads the body (a GET) does not skip its check: the answer leaves only when
    the body that came is the one signed, none included."""
    daemon = start_daemon(files / "repo", env={"APPLIANCE_AUTH_TOKEN": TOKEN, "APPLIANCE_PROTECT_INFERENCE": "true",
                                               "APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"}, wait_loaded=False)
    path, body = "/v2/models/stats", b'{"ignored": true}'

    def header(signed: bytes) -> str:
        answer = _nonce(daemon.port)
        return sign(TOKEN, answer["id"], answer["nonce"], "GET", path, signed)

    assert _raw(daemon.port, "GET", path, header(b""), "content-length", body) == b"HTTP/1.1 401 Unauthorized"
    assert _raw(daemon.port, "GET", path, header(b""), "chunked", body) == b"HTTP/1.1 401 Unauthorized"
    assert _raw(daemon.port, "GET", path, header(body), "none") == b"HTTP/1.1 401 Unauthorized"
    assert _raw(daemon.port, "GET", path, header(body), "chunked") == b"HTTP/1.1 401 Unauthorized"
    assert _raw(daemon.port, "GET", path, header(body), "content-length", body) == b"HTTP/1.1 200 OK"
    assert _raw(daemon.port, "GET", path, header(b""), "none") == b"HTTP/1.1 200 OK"


def _appliance(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


def _cli_env(tmp_path: Path) -> dict:
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    environment.update({"APPLIANCE_STATE_DIR": str(tmp_path / "cli"),
                        "APPLIANCE_TRUSTED_BOXES": str(tmp_path / "trusted.json")})
    return environment


def test_appliance_push_and_fleet_never_put_the_token_on_the_wire(box, files, tmp_path):
    """Through a relay that records every byte the CLI sends (what a box in the middle sees): the box
    behind it loads the model; the recording holds no token and replays to nothing."""
    seen: list[bytes] = []
    env = _cli_env(tmp_path)
    with relay(box.port, REMOTE, seen) as port:
        url = f"http://127.0.0.1:{port}"
        pushed = _appliance("push", str(files / "push" / "tripler"), "--url", url, "--token-file",
                            str(files / "token"), "--name", "wire", env=env)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        listed = _appliance("fleet", "--json", "--url", url, "--token-file", str(files / "token"), env=env)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["error"] is None and row["trusted"] and row["models_total"] >= 2
        refused = _appliance("push", str(files / "push" / "tripler"), "--url", url, "--name", "wire2", env=env)
        assert refused.returncode == 1 and "HTTP 401" in refused.stdout and "--token-file F" in refused.stdout
    assert "wire" in _models(box.port) and "wire2" not in _models(box.port)
    wire = b"".join(seen)
    assert b"Authorization: Fleet " in wire and TOKEN.encode() not in wire and b"Bearer" not in wire
    call(box.port, "POST", "/v2/repository/models/wire/unload", b"{}", headers={"Content-Type": "application/json"})
    loads = [request for request in _requests(wire) if request.startswith(b"POST /v2/repository/models/wire/load")]
    assert len(loads) == 1
    assert _replay(box.port, loads[0]).startswith(b"HTTP/1.1 401")
    assert "wire" not in _models(box.port)


def _requests(wire: bytes) -> list[bytes]:
    """The HTTP requests in a recording, one after another (the CLI sends one at a time)."""
    found = []
    while wire:
        head, _, rest = wire.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        found.append(head + b"\r\n\r\n" + rest[:length])
        wire = rest[length:]
    return found


def _replay(port: int, raw: bytes) -> bytes:
    """Send recorded request bytes as they were, from a non-exempt address; the status line answered."""
    with socket.create_connection(("127.0.0.1", port), source_address=(REMOTE, 0), timeout=30) as sock:
        sock.sendall(raw)
        return sock.recv(65536)


def test_pins_by_address_and_a_box_that_is_not_the_one_pinned_there(box, files, tmp_path):
    env = _cli_env(tmp_path)
    url = f"127.0.0.1:{box.port}"
    wrong = _appliance("fleet", "trust", "--url", url, "--id", "ffffffff-0000-4000-8000-000000000000", env=env)
    assert wrong.returncode == 1 and f"is box {box.extra['id']}, not ffffffff" in wrong.stdout
    pinned = _appliance("fleet", "trust", "--url", url, "--id", box.extra["id"], env=env)
    assert pinned.returncode == 0 and f"pinned {url}: box {box.extra['id']} at {url}" in pinned.stdout
    listed = _appliance("fleet", "trusted", "--json", env=env)
    assert [(p["id"], p["address"]) for p in json.loads(listed.stdout)] == [(box.extra["id"], url)]
    # Another box is pinned at that address (as if this one had replaced it): a push by URL is refused.
    pins = json.loads(Path(env["APPLIANCE_TRUSTED_BOXES"]).read_text())
    pins["boxes"][0]["id"] = "0ld0ld00-0000-4000-8000-000000000000"
    Path(env["APPLIANCE_TRUSTED_BOXES"]).write_text(json.dumps(pins))
    refused = _appliance("push", str(files / "push" / "tripler"), "--url", url, "--token-file", str(files / "token"),
                         "--name", "replaced", env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"not pushed: the box at {url} now says it is box {box.extra['id']}" in refused.stdout
    assert "appliance fleet trust --url" in refused.stdout and "replaced" not in _models(box.port)
    assert _appliance("fleet", "untrust", url, env=env).returncode == 0
    assert json.loads(_appliance("fleet", "trusted", "--json", env=env).stdout) == []
