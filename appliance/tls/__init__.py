"""TLS for every port: the server contexts the front ends listen with (``context``), and the box's own
self-signed certificate (``certificate``: ``appliance tls init``, fingerprints)."""

from appliance.tls.certificate import fingerprint, make_self_signed
from appliance.tls.context import ServerTls, check_private_key

__all__ = ["ServerTls", "check_private_key", "fingerprint", "make_self_signed"]
