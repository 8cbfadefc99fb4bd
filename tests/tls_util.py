"""Certificates for the TLS tests (trustme): a CA, a server certificate for 127.0.0.1 and a client
certificate, as PEM files with their keys 0600; the daemon's flags for them; and a wait for a daemon whose
HTTP port speaks TLS (the fixtures' own wait speaks plain HTTP)."""

from __future__ import annotations

import datetime
import ssl
import urllib.request
from pathlib import Path

import trustme

from appliance.tls.certificate import fingerprint
from tests.waiting import wait_until

__all__ = ["Pki", "wait_until_loaded"]


class Pki:
    def __init__(self, directory: Path, *, not_after: datetime.datetime | None = None) -> None:
        self.ca = trustme.CA()
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.cert, self.key = self._issue(directory, "server", "127.0.0.1", "localhost", not_after=not_after)
        self.client_cert, self.client_key = self._issue(directory, "client", "client@example")
        self.fingerprint = fingerprint(self.cert.read_bytes())

    def _issue(self, directory: Path, name: str, *identities: str,
               not_after: datetime.datetime | None = None) -> tuple[Path, Path]:
        issued = self.ca.issue_cert(*identities, not_after=not_after)
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        issued.cert_chain_pems[0].write_to_path(cert)
        issued.private_key_pem.write_to_path(key)
        key.chmod(0o600)
        return cert, key

    def flags(self, port: str, mutual: bool = False) -> list[str]:
        """``--<port>-use-ssl=true`` and the certificate; ``mutual``: Triton's spelling, the mutual flag (which
        turns TLS on by itself) and the CA client certificates must chain to."""
        flags = [f"--{port}-use-ssl-mutual=true" if mutual else f"--{port}-use-ssl=true", f"--{port}-server-cert",
                 str(self.cert), f"--{port}-server-key", str(self.key)]
        return flags + ([f"--{port}-root-cert", str(self.ca_file)] if mutual else [])

    def context(self, client_cert: bool = False) -> ssl.SSLContext:
        """A client's context that trusts this CA (and presents the client certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def wait_until_loaded(daemon, pki: Pki, timeout: float = 60) -> None:
    """Until the daemon's TLS HTTP port lists a READY model in its repository index."""
    context = pki.context()

    def ready() -> bool:
        try:
            request = urllib.request.Request(f"https://{daemon.url}/v2/repository/index", data=b"{}", method="POST")
            return b"READY" in urllib.request.urlopen(request, timeout=2, context=context).read()
        except OSError:
            return False

    try:
        wait_until(ready, timeout=timeout, what="a READY model on the TLS port", interval=0.1)
    except AssertionError:
        raise TimeoutError(f"the daemon did not load its repository in time:\n{daemon.log()[-3000:]}") from None
