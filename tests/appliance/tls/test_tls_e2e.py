"""TLS on the HTTP and gRPC ports end to end, with Triton's flags: tritonclient over TLS (HTTP and gRPC),
mutual TLS, and what is refused (a plaintext request, a client certificate of another
CA or none, an expired server certificate, a key others can read). Certificates come from trustme."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.builders import identity_model, write_model
from tests.tls_util import Pki
from tests.waiting import wait_until

X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "identity", identity_model(["FP32"]))
    return repo


def _https(daemon, pki: Pki, client_cert: bool = False) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(daemon.url, ssl=True,
                                            ssl_context_factory=lambda: pki.context(client_cert))


def _grpcs(daemon, pki: Pki, client_cert: bool = False) -> grpcclient.InferenceServerClient:
    extra = {"private_key": str(pki.client_key), "certificate_chain": str(pki.client_cert)} if client_cert else {}
    return grpcclient.InferenceServerClient(daemon.grpc_url, ssl=True, root_certificates=str(pki.ca_file), **extra)


def _infer(client) -> None:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    tensor = module.InferInput("IN_FP32", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUT_FP32"), X)


def _ready(client, timeout: float = 60) -> None:
    def ready() -> bool:
        try:
            return bool(client.is_server_ready())
        except (InferenceServerException, OSError):
            return False

    wait_until(ready, timeout=timeout, what="the daemon to become ready over TLS", interval=0.1)


def _start(start_daemon, repository, pki, *flags, ready_with=None):
    daemon = start_daemon(repository, *flags, wait_loaded=False)
    _ready(ready_with(daemon) if ready_with else _https(daemon, pki))
    return daemon


def test_http_and_grpc_over_tls_with_tritonclient(start_daemon, repository, pki):
    daemon = _start(start_daemon, repository, pki, *pki.flags("http"), *pki.flags("grpc"))
    assert "serving KServe v2 on https://" in daemon.log() and "over gRPC (TLS)" in daemon.log()
    https = _https(daemon, pki)
    assert https.is_server_live()
    _infer(https)
    grpcs = _grpcs(daemon, pki)
    assert grpcs.is_server_live()
    _infer(grpcs)
    # A plaintext request on each TLS port is refused (the handshake fails), nothing else disturbed.
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as plain:
        plain.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = plain.recv(4096)
        assert not answer.startswith(b"HTTP/"), answer  # no HTTP answer in the clear
    with pytest.raises(InferenceServerException):
        grpcclient.InferenceServerClient(daemon.grpc_url).is_server_live()  # plaintext HTTP/2
    _infer(https)
    _infer(grpcs)


def test_mutual_tls_takes_only_clients_of_its_ca(start_daemon, repository, pki, tmp_path):
    daemon = _start(start_daemon, repository, pki, *pki.flags("http", mutual=True), *pki.flags("grpc", mutual=True),
                    ready_with=lambda d: _https(d, pki, client_cert=True))
    _infer(_https(daemon, pki, client_cert=True))
    _infer(_grpcs(daemon, pki, client_cert=True))
    stranger = Pki(tmp_path / "other")  # a client certificate of another CA
    for client in (_https(daemon, pki), _grpcs(daemon, pki)):  # no client certificate
        with pytest.raises(Exception):  # noqa: B017 - refused in the handshake: each client says it its own way
            client.is_server_live()
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.load_cert_chain(stranger.client_cert, stranger.client_key)
    with pytest.raises((ssl.SSLError, OSError)), \
            socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        if not tls.recv(4096):  # TLS 1.3: the refusal arrives after the handshake
            raise ConnectionResetError("closed")
    _infer(_https(daemon, pki, client_cert=True))  # still serving its own clients


def test_an_expired_server_certificate_is_refused_by_the_client(start_daemon, repository, tmp_path):
    expired = Pki(tmp_path / "expired", not_after=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1))
    daemon = start_daemon(repository, *expired.flags("http"), wait_loaded=False)
    wait_until(lambda: "serving KServe v2 on https://" in daemon.log(), timeout=30, what="the HTTPS port to bind")
    with pytest.raises(Exception, match="(?i)certificate has expired|CERTIFICATE_VERIFY_FAILED"):  # noqa: B017
        _https(daemon, expired).is_server_live()


def test_a_key_others_can_read_stops_the_daemon_with_the_fix(start_daemon, repository, tmp_path):
    pki = Pki(tmp_path / "loose")
    pki.key.chmod(0o644)
    with pytest.raises(RuntimeError, match=f"chmod 600 {pki.key}"):
        start_daemon(repository, *pki.flags("grpc"))


@pytest.mark.parametrize("flags, words", [
    (["--http-use-ssl=true"], "run `appliance tls init` first"),
    (["--grpc-server-cert", "x.pem", "--grpc-server-key", "x.key"], "take effect with --grpc-use-ssl=true"),
    (["--grpc-use-ssl-mutual=true"], "run `appliance tls init` first"),  # mutual TLS is TLS, as Triton's flag
    (["--http-use-ssl=maybe"], "expected true or false"),
])
def test_incomplete_tls_flags_say_what_is_missing(start_daemon, repository, flags, words):
    with pytest.raises(RuntimeError, match=words):
        start_daemon(repository, *flags)


def test_tls_init_makes_the_boxs_own_certificate_and_the_daemon_serves_it(start_daemon, repository, tmp_path):
    state = tmp_path / "state"
    made = subprocess.run([sys.executable, "-m", "appliance", "tls", "init", "--state-dir", str(state)],
                          capture_output=True, text=True, check=True)
    cert, key = state / "tls" / "server.crt", state / "tls" / "server.key"
    assert {oct(cert.stat().st_mode & 0o777), oct(key.stat().st_mode & 0o777)} == {"0o600"}
    assert "SHA-256 fingerprint" in made.stdout
    again = subprocess.run([sys.executable, "-m", "appliance", "tls", "init", "--state-dir", str(state)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "--force" in again.stderr  # never replaced behind a pinning fleet's back
    daemon = start_daemon(repository, "--http-use-ssl", "--grpc-use-ssl=true", state=state, wait_loaded=False)

    def trusting(d):
        return httpclient.InferenceServerClient(
            d.url, ssl=True, ssl_context_factory=lambda: ssl.create_default_context(cafile=str(cert)))

    _ready(trusting(daemon))
    _infer(trusting(daemon))
    _infer(grpcclient.InferenceServerClient(daemon.grpc_url, ssl=True, root_certificates=str(cert)))
    assert os.access(key, os.R_OK)


def test_tritons_mutual_flag_alone_turns_tls_on(start_daemon, repository, pki):
    """Triton's spelling in its own deployments: --grpc-use-ssl-mutual=true and the certificates, with no
    --grpc-use-ssl (in Triton the mutual flag turns TLS on)."""
    daemon = start_daemon(repository, "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(pki.cert),
                          "--grpc-server-key", str(pki.key), "--grpc-root-cert", str(pki.ca_file))
    assert "over gRPC (TLS)" in daemon.log()
    _infer(_grpcs(daemon, pki, client_cert=True))
    with pytest.raises(InferenceServerException):
        _grpcs(daemon, pki).is_server_live()  # no client certificate
