"""NVIDIA's perf_analyzer, unchanged, against the appliance over TLS: gRPC with Triton's client flags
(``--ssl-grpc-use-ssl=true`` and the server's root certificate; with a client certificate when the port
takes mutual TLS), and HTTPS through libcurl with the CA bundle. A client without a
certificate is refused by a mutual-TLS port. Certificates come from trustme."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import identity_model, write_model
from tests.oracle import TritonUnavailable, run_perf_analyzer
from tests.tls_util import wait_until_loaded

# That it runs over TLS is the point, not a stable figure: two shared cores make windows vary widely.
_MEASURE = ["--concurrency-range", "1", "--measurement-mode", "count_windows", "--measurement-request-count", "20",
            "--stability-percentage", "1000"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    write_model(path, "identity", identity_model(["FP32"]))
    return path


@pytest.fixture(scope="module")
def tls_daemon(module_daemon, repository, pki):
    """HTTP and gRPC over TLS."""
    daemon = module_daemon(repository, *pki.flags("http"), *pki.flags("grpc"), wait_loaded=False)
    wait_until_loaded(daemon, pki)
    return daemon


def _perf(daemon, triton, *args: str):
    try:
        return run_perf_analyzer(["-m", "identity", *args, *_MEASURE], timeout=120, triton=triton)
    except TritonUnavailable as error:
        pytest.fail(f"perf_analyzer failed against the appliance over TLS: {error}\n{daemon.log()[-3000:]}")


def test_perf_analyzer_runs_over_grpc_tls(triton_install, tls_daemon, pki):
    result = _perf(tls_daemon, triton_install, "-u", tls_daemon.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl", "true",
                   "--ssl-grpc-root-certifications-file", str(pki.ca_file))
    assert result.best.throughput > 0


def test_perf_analyzer_runs_over_https(triton_install, tls_daemon, pki):
    result = _perf(tls_daemon, triton_install, "-u", f"https://{tls_daemon.url}", "-i", "http",
                   "--ssl-https-ca-certificates-file", str(pki.ca_file), "--ssl-https-verify-peer", "1",
                   "--ssl-https-verify-host", "2")
    assert result.best.throughput > 0


def test_perf_analyzer_over_mutual_grpc_tls(triton_install, start_daemon, repository, pki):
    """With its client certificate it runs; without one, the handshake refuses it (and the port serves on)."""
    daemon = start_daemon(repository, *pki.flags("grpc", mutual=True))
    trusted = ["-u", daemon.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl", "true",
               "--ssl-grpc-root-certifications-file", str(pki.ca_file)]
    with pytest.raises(TritonUnavailable) as refused:
        run_perf_analyzer(["-m", "identity", *trusted, *_MEASURE], timeout=120, triton=triton_install)
    assert "failed to connect" in str(refused.value)  # refused in the handshake, not answered with an error
    result = _perf(daemon, triton_install, *trusted, "--ssl-grpc-certificate-chain-file", str(pki.client_cert),
                   "--ssl-grpc-private-key-file", str(pki.client_key))
    assert result.best.throughput > 0
