"""A port's TLS, from its settings: the certificate and key it serves, the CA its clients' certificates
must chain to (mutual TLS), checked at start so that a mistake stops the daemon with the fix.

The key must be readable by its owner alone: the daemon never serves TLS with a key others can read.
TLS 1.2 at least. The same ``ServerTls`` builds an ``ssl.SSLContext`` for the HTTP port (aiohttp and the
infer lane share its socket) and the appliance's own gRPC transport (ALPN h2).
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Sequence
from pathlib import Path

from appliance.core.errors import ConfigError
from appliance.core.private_files import check_private_file

__all__ = ["ServerTls", "check_private_key"]


def check_private_key(path: Path, flag: str) -> None:
    """Refuse a key file that is missing, or that the group or others may read or write."""
    check_private_file(path, flag, missing="make a key and certificate with `appliance tls init`, or name yours",
                       exposed="the daemon never serves TLS with a key others can read")


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTls:
    """One port's TLS. ``root``: the CA bundle client certificates must chain to, when ``mutual``."""

    cert: Path
    key: Path
    root: Path | None = None
    mutual: bool = False
    flag: str = "--http"
    """How the port's flags are spelled in messages (--http or --grpc)."""

    def check(self) -> None:
        """Everything a context needs, checked now: ConfigError with the fix otherwise."""
        check_private_key(self.key, f"{self.flag}-server-key")
        if self.mutual and self.root is None:
            raise ConfigError(f"{self.flag}-use-ssl-mutual needs {self.flag}-root-cert: the CA that client "
                              "certificates must chain to")
        self.context()

    def context(self, alpn: Sequence[str] = ()) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{self.flag}-server-cert {self.cert} with {self.flag}-server-key {self.key} cannot "
                              f"be used ({exc}); give a PEM certificate and its PEM private key") from None
        if self.root is not None:
            try:
                context.load_verify_locations(cafile=str(self.root))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"{self.flag}-root-cert {self.root} cannot be used ({exc}); give a PEM CA "
                                  "bundle") from None
        context.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
        if alpn:
            context.set_alpn_protocols(list(alpn))
        return context
