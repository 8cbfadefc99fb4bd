"""Which box a fleet command acts on when it is named by URL: a pin is a box id and its certificate at a
numeric address, so a URL whose host resolves to a pinned address (``localhost`` for 127.0.0.1) names
that pinned box and gets its checks, and a box that says it is a pinned box must prove it wherever it
answers. The boxes are in-process fakes on 127.0.0.1 (plain HTTP, or TLS with trustme certificates)
that answer any box id they are told to, as an impostor would, and record every request they get."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from appliance.client.boxes import Box
from appliance.client.trust import TrustStore
from appliance.commands import fleet, push
from appliance.settings import load_settings
from tests.tls_util import Pki

REAL = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"
HARDWARE = "Intel(R) Core(TM) i5-1235U (12 threads, avx avx2 avx512f fma sse4), 15.4 GiB; accelerators: cpu"
"""Its 70th character falls inside "15.4": the table used to cut the number in two."""
_TLS_HELLO = 0x16


class FakeBox:
    """Answers /v2/fleet/nonce with ``box_id`` and 200 to everything else, over TLS with ``pki``'s
    certificate or over plain HTTP (where a TLS hello gets an HTTP 400 at once, as a real server's parser
    answers it); ``seen``: every request's method and path."""

    def __init__(self, box_id: str, pki: Pki | None) -> None:
        self.seen: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def log_message(self, *args: object) -> None:
                pass

            def handle(self) -> None:
                if pki is None and self.connection.recv(1, socket.MSG_PEEK) == bytes([_TLS_HELLO]):
                    self.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                super().handle()

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.seen.append((self.command, self.path))
                answer: object = {}
                if self.path == "/v2/fleet/nonce":
                    answer = {"id": box_id, "nonce": f"nonce-{len(fake.seen)}"}
                elif self.path == "/v2/repository/index":
                    answer = [{"name": "resident", "version": "1", "state": "READY"}]
                elif self.path == "/v2/probe":
                    answer = {"summary": HARDWARE}
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if pki is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pki.cert, pki.key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def loads(self) -> list[str]:
        return [path for method, path in self.seen if path.endswith("/load")]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@pytest.fixture
def fake_box() -> Iterator[Callable[..., FakeBox]]:
    made: list[FakeBox] = []

    def make(box_id: str = REAL, pki: Pki | None = None) -> FakeBox:
        made.append(FakeBox(box_id, pki))
        return made[-1]

    yield make
    for box in made:
        box.stop()


@pytest.fixture(scope="module")
def pkis(tmp_path_factory) -> dict[str, Pki]:
    """The pinned box's certificate and an impostor's (another key, the same names)."""
    return {name: Pki(tmp_path_factory.mktemp(name)) for name in ("real", "impostor")}


@pytest.fixture
def model_dir(tmp_path) -> Path:
    directory = tmp_path / "mlp"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.onnx").write_bytes(b"weights")
    return directory


def _pin(path: Path, port: int, fingerprint: str = "", box_id: str = REAL) -> None:
    store = TrustStore.load(path)
    store.pin(Box(name="aisle-3", addresses=("127.0.0.1",), port=port), box_id, fingerprint)
    store.save()


def _appliance(capsys, pins: Path, *argv: str) -> tuple[int, str]:
    """A fleet command run in this process, as `appliance ...` runs it: (exit status, stdout + stderr)."""
    parser = argparse.ArgumentParser(prog="appliance")
    commands = parser.add_subparsers(dest="command", required=True)
    fleet.add_parser(commands)
    push.add_parser(commands)
    args = parser.parse_args(argv)
    settings = load_settings({}, {"APPLIANCE_TRUSTED_BOXES": str(pins)})
    status = {"fleet": fleet, "push": push}[args.command].run(args, settings)
    printed = capsys.readouterr()
    return status, printed.out + printed.err


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("scheme", ["https", "http"])
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_an_impostor_at_a_tls_pinned_address_is_refused_under_any_name(capsys, tmp_path, fake_box, pkis, model_dir,
                                                                        host, scheme):
    """The box pinned at 127.0.0.1 with its certificate is gone; an impostor with another key answers its
    id at that address. Named by a name of that address, or over http://, it is still the pinned box's
    address: the certificate is checked, and nothing is sent."""
    pins = tmp_path / "pins.json"
    impostor = fake_box(REAL, pkis["impostor"])
    _pin(pins, impostor.port, pkis["real"].fingerprint)
    url = f"{scheme}://{host}:{impostor.port}"
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", url)
    assert status == 1 and "not pushed" in said, said
    assert f"presents the TLS certificate {pkis['impostor'].fingerprint}, but it was pinned with " \
           f"{pkis['real'].fingerprint}" in said
    suggested = f"appliance fleet trust --url https://{host}:{impostor.port}"
    assert f"pin it again: {suggested}" in said
    status, listed = _appliance(capsys, pins, "fleet", "--json", "--url", url)
    (row,) = json.loads(listed)
    assert row["trust"] == "CHANGED" and row["models_ready"] is None and "presents the TLS certificate" in row["error"]
    assert suggested in row["error"]
    assert impostor.seen == []  # refused before the first request
    # Had the certificate been replaced on purpose, the command suggested pins the box again, as it is now.
    status, said = _appliance(capsys, pins, *suggested.split()[1:])
    assert status == 0, said
    (pin,) = json.loads(pins.read_text())["boxes"]
    assert (pin["address"], pin["id"], pin["fingerprint"]) == ("127.0.0.1", REAL, pkis["impostor"].fingerprint)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_plain_http_impostor_at_a_tls_pinned_address_gets_nothing(capsys, tmp_path, fake_box, pkis, model_dir,
                                                                    host):
    """http://localhost:P for a box pinned with TLS at 127.0.0.1:P: the pin says TLS, so TLS it is; the
    impostor speaking plain HTTP there never gets a request, let alone the model."""
    pins = tmp_path / "pins.json"
    impostor = fake_box(REAL, None)
    _pin(pins, impostor.port, pkis["real"].fingerprint)
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", f"http://{host}:{impostor.port}")
    assert status == 1 and "TLS handshake with https://127.0.0.1:" in said, said
    assert impostor.seen == []


def test_a_box_that_says_it_is_a_tls_pinned_box_must_present_its_certificate(capsys, tmp_path, fake_box, pkis,
                                                                             model_dir):
    """At an address where nothing is pinned, a box saying the pinned box's id is refused unless it presents
    the pinned certificate (over TLS): the id alone is anyone's to say."""
    pins = tmp_path / "pins.json"
    _pin(pins, _unused_port(), pkis["real"].fingerprint)
    forged, plain = fake_box(REAL, pkis["impostor"]), fake_box(REAL, None)
    for box, words in ((forged, f"presents the TLS certificate {pkis['impostor'].fingerprint}, not "
                                f"{pkis['real'].fingerprint}"), (plain, "but it answers plain HTTP")):
        url = f"{'https' if box is forged else 'http'}://localhost:{box.port}"
        status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", url)
        assert status == 1 and words in said and f"appliance fleet trust --url {url}" in said, said
        status, listed = _appliance(capsys, pins, "fleet", "--json", "--url", url)
        (row,) = json.loads(listed)
        assert row["trust"] == "CHANGED" and words in row["error"] and row["models_ready"] is None, row
        assert box.seen == [("GET", "/v2/fleet/nonce")] * 2 and box.loads == []
    moved = fake_box(REAL, pkis["real"])  # the pinned box itself, reached at another address: its key proves it
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", f"https://localhost:{moved.port}")
    assert status == 0 and moved.loads == ["/v2/repository/models/mlp/load"], said


def test_a_box_that_says_it_is_a_plain_pinned_box_must_answer_at_its_address(capsys, tmp_path, fake_box, model_dir):
    pins = tmp_path / "pins.json"
    elsewhere = fake_box(REAL, None)
    _pin(pins, _unused_port())
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", f"http://localhost:{elsewhere.port}")
    assert status == 1 and "over plain HTTP, where nothing but that address proves it" in said, said
    assert elsewhere.loads == []
    stranger = fake_box(OTHER, None)  # no pinned box: named by URL, it is trusted for this command
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", f"http://localhost:{stranger.port}")
    assert status == 0 and stranger.loads == ["/v2/repository/models/mlp/load"], said


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_the_pinned_box_named_by_another_name_of_its_address_is_pushed_to(capsys, tmp_path, fake_box, pkis,
                                                                          model_dir, scheme):
    pins = tmp_path / "pins.json"
    real = fake_box(REAL, pkis["real"])
    _pin(pins, real.port, pkis["real"].fingerprint)
    url = f"{scheme}://localhost:{real.port}"
    status, said = _appliance(capsys, pins, "push", str(model_dir), "--url", url)
    assert status == 0 and f"pushing mlp (0.0 kB) to https://127.0.0.1:{real.port}" in said, said
    assert real.loads == ["/v2/repository/models/mlp/load"]
    status, listed = _appliance(capsys, pins, "fleet", "--json", "--url", url)
    (row,) = json.loads(listed)
    assert (row["trust"], row["error"], row["url"]) == ("pinned", None, f"https://127.0.0.1:{real.port}"), row


def test_pinning_by_a_name_pins_the_address_it_resolves_to(capsys, tmp_path, fake_box, pkis):
    pins = tmp_path / "pins.json"
    real = fake_box(REAL, pkis["real"])
    status, said = _appliance(capsys, pins, "fleet", "trust", "--url", f"https://localhost:{real.port}")
    assert status == 0 and f"at 127.0.0.1:{real.port}" in said, said
    (pin,) = json.loads(pins.read_text())["boxes"]
    assert (pin["address"], pin["port"], pin["id"], pin["fingerprint"]) == (
        "127.0.0.1", real.port, REAL, pkis["real"].fingerprint)


def test_the_fleet_table_cuts_the_hardware_between_words(capsys, tmp_path, fake_box):
    box = fake_box(OTHER, None)
    status, table = _appliance(capsys, tmp_path / "pins.json", "fleet", "--url", f"http://127.0.0.1:{box.port}")
    assert status == 0, table
    (row,) = [line for line in table.splitlines() if line.startswith(f"127.0.0.1:{box.port}")]
    assert " ..." in row, row
    cell = row[row.index("Intel(R)"):row.index(" ...")]
    assert HARDWARE.startswith(cell) and HARDWARE[len(cell)] == " " and len(cell) <= 70, row  # whole words
