"""TLS for every port: the server contexts the front ends listen with (``context``), and the box's own
self-signed certificate (``certificate``: ``appliance tls init``, fingerprints; it loads ``cryptography``,
which a serving daemon does not need)."""
