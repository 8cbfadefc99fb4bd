"""Who a request comes from, and settings the access rules take."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from appliance.protocol.admission import parse_networks
from appliance.rest.security import client_address


@pytest.mark.parametrize("peer, forwarded, expected", [
    ("10.0.0.5", None, "10.0.0.5"),                      # no proxy in between
    ("10.0.0.5", "127.0.0.1", "10.0.0.5"),               # not a trusted proxy: its header is ignored
    ("127.0.0.1", None, "127.0.0.1"),
    ("127.0.0.1", "192.168.1.20", "192.168.1.20"),       # the proxy says who the client is
    ("127.0.0.1", "6.6.6.6, 192.168.1.20", "192.168.1.20"),  # the client's own claim is not believed
    ("127.0.0.1", "192.168.1.20, 127.0.0.1", "192.168.1.20"),  # a chain of trusted proxies
    ("127.0.0.1", "junk", "junk"),                       # not an address: never exempt
])
def test_client_address_behind_trusted_proxies(peer, forwarded, expected):
    headers = CIMultiDict({"X-Forwarded-For": forwarded} if forwarded else {})
    assert client_address(headers, peer, parse_networks(["127.0.0.0/8"])) == expected
