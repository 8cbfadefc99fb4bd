"""The box's own certificate: a self-signed one for its names and addresses (``appliance tls init``), and
the SHA-256 fingerprint a fleet pins it by."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["fingerprint", "make_self_signed"]


def fingerprint(pem: bytes) -> str:
    """SHA-256 of the certificate's DER bytes, as hex pairs joined by ':' (what browsers and openssl show)."""
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def _names(extra: Sequence[str]) -> list[x509.GeneralName]:
    host = socket.gethostname()
    names: list[x509.GeneralName] = []
    for name in dict.fromkeys([host, f"{host.split('.')[0]}.local", "localhost", "127.0.0.1", "::1", *extra]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    return names


def make_self_signed(cert_path: Path, key_path: Path, *, names: Sequence[str] = (), days: int = 3650) -> str:
    """Write a new P-256 key and a self-signed certificate (both mode 0600) for this host's names,
    ``localhost``, the loopback addresses and ``names``; returns the certificate's fingerprint."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, socket.gethostname()[:64] or "appliance"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edge appliance")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_names(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        out.write(key_bytes)
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    descriptor = os.open(cert_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:  # public, but the state dir's files are the daemon user's alone
        os.fchmod(out.fileno(), 0o600)
        out.write(pem)
    return fingerprint(pem)
