"""NVIDIA's perf_analyzer, unchanged, against the appliance over TLS: gRPC with Triton's client flags
(``--ssl-grpc-use-ssl=true`` and the server's root certificate; with a client certificate when the port
takes mutual TLS) on both gRPC transports, and HTTPS through libcurl with the CA bundle. A client without a
certificate is refused by a mutual-TLS port. Certificates come from trustme."""

from __future__ import annotations

import ssl
import time
import urllib.request
from pathlib import Path

import pytest
import trustme

from tests.builders import identity_model, write_model
from tests.oracle import TritonUnavailable, run_perf_analyzer

# That it runs over TLS is the point, not a stable figure: two shared cores make windows vary widely.
_MEASURE = ["--concurrency-range", "1", "--measurement-mode", "count_windows", "--measurement-request-count", "20",
            "--stability-percentage", "1000"]


class _Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files (keys 0600)."""

    def __init__(self, directory: Path) -> None:
        ca = trustme.CA()
        self.ca = directory / "ca.pem"
        ca.cert_pem.write_to_path(self.ca)
        self.cert, self.key = self._issue(ca, directory, "server", "127.0.0.1", "localhost")
        self.client_cert, self.client_key = self._issue(ca, directory, "client", "perf-analyzer@example")

    @staticmethod
    def _issue(ca: trustme.CA, directory: Path, name: str, *identities: str) -> tuple[Path, Path]:
        issued = ca.issue_cert(*identities)
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        for blob in issued.cert_chain_pems:
            blob.write_to_path(cert, append=True)
        issued.private_key_pem.write_to_path(key)
        key.chmod(0o600)
        return cert, key

    def flags(self, port: str, mutual: bool = False) -> list[str]:
        """Triton's spelling: the mutual flag alone turns TLS on."""
        flags = [f"--{port}-use-ssl-mutual=true" if mutual else f"--{port}-use-ssl=true", f"--{port}-server-cert",
                 str(self.cert), f"--{port}-server-key", str(self.key)]
        return flags + ([f"--{port}-root-cert", str(self.ca)] if mutual else [])


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> _Pki:
    return _Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    write_model(path, "identity", identity_model(["FP32"]))
    return path


def _wait_until_loaded(daemon, pki: _Pki, timeout: float = 60) -> None:
    """The fixtures' own wait speaks plain HTTP: this one asks the TLS port for its repository index."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(f"https://{daemon.url}/v2/repository/index", data=b"{}", method="POST")
            if b"READY" in urllib.request.urlopen(request, timeout=2, context=context).read():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the daemon did not load its repository in time:\n{daemon.log()[-3000:]}")


@pytest.fixture(scope="module")
def tls_daemon(module_daemon, repository, pki, grpc_transport):
    """HTTP and gRPC over TLS, once per gRPC transport."""
    daemon = module_daemon(repository, *pki.flags("http"), *pki.flags("grpc"),
                           env={"APPLIANCE_GRPC_TRANSPORT": grpc_transport}, wait_loaded=False)
    _wait_until_loaded(daemon, pki)
    return daemon


def _perf(daemon, triton, *args: str):
    try:
        return run_perf_analyzer(["-m", "identity", *args, *_MEASURE], timeout=120, triton=triton)
    except TritonUnavailable as error:
        pytest.fail(f"perf_analyzer failed against the appliance over TLS: {error}\n{daemon.log()[-3000:]}")


def test_perf_analyzer_runs_over_grpc_tls(triton_install, tls_daemon, pki):
    result = _perf(tls_daemon, triton_install, "-u", tls_daemon.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl", "true",
                   "--ssl-grpc-root-certifications-file", str(pki.ca))
    assert result.best.throughput > 0


def test_perf_analyzer_runs_over_https(triton_install, tls_daemon, pki):
    result = _perf(tls_daemon, triton_install, "-u", f"https://{tls_daemon.url}", "-i", "http",
                   "--ssl-https-ca-certificates-file", str(pki.ca), "--ssl-https-verify-peer", "1",
                   "--ssl-https-verify-host", "2")
    assert result.best.throughput > 0


def test_perf_analyzer_over_mutual_grpc_tls(triton_install, start_daemon, repository, pki):
    """With its client certificate it runs; without one, the handshake refuses it (and the port serves on)."""
    daemon = start_daemon(repository, *pki.flags("grpc", mutual=True))
    trusted = ["-u", daemon.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl", "true",
               "--ssl-grpc-root-certifications-file", str(pki.ca)]
    with pytest.raises(TritonUnavailable) as refused:
        run_perf_analyzer(["-m", "identity", *trusted, *_MEASURE], timeout=120, triton=triton_install)
    assert "failed to connect" in str(refused.value)  # refused in the handshake, not answered with an error
    result = _perf(daemon, triton_install, *trusted, "--ssl-grpc-certificate-chain-file", str(pki.client_cert),
                   "--ssl-grpc-private-key-file", str(pki.client_key))
    assert result.best.throughput > 0
