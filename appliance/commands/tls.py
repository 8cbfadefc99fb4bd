"""``appliance tls init|show``: the box's own TLS certificate, in <state_dir>/tls/ (server.crt, and
server.key readable by its owner alone), which ``--http-use-ssl`` and ``--grpc-use-ssl`` serve when no
certificate is named."""

from __future__ import annotations

import argparse
from typing import Any

from appliance.core.errors import ConfigError
from appliance.settings import Settings
from appliance.tls.certificate import fingerprint, make_self_signed

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("tls", help="make (init) or show the box's own self-signed TLS certificate")
    parser.add_argument("action", choices=["init", "show"])
    parser.add_argument("--state-dir", type=str, help="the daemon's state dir")
    parser.add_argument("--name", dest="tls_names", action="append", metavar="NAME",
                        help="another host name or IP address the certificate is for (repeatable)")
    parser.add_argument("--force", action="store_true", help="replace an existing certificate and key")


def run(args: argparse.Namespace, settings: Settings) -> int:
    directory = settings.server.state_dir / "tls"
    cert, key = directory / "server.crt", directory / "server.key"
    if args.action == "show":
        if not cert.exists():
            raise ConfigError(f"there is no certificate at {cert}: make one with `appliance tls init`")
        print(f"{cert}\nSHA-256 fingerprint {fingerprint(cert.read_bytes())}")
        return 0
    if cert.exists() and not args.force:
        raise ConfigError(f"{cert} exists (fingerprint {fingerprint(cert.read_bytes())}); pinned boxes and clients "
                          "trust it: add --force to replace it")
    try:
        pin = make_self_signed(cert, key, names=args.tls_names or ())
    except OSError as exc:
        raise ConfigError(f"cannot write the certificate into {directory}: {exc.strerror or exc}") from None
    print(f"made {cert} and {key} (mode 0600)\nSHA-256 fingerprint {pin}\n"
          "serve it with: appliance serve --http-use-ssl=true --grpc-use-ssl=true")
    return 0
