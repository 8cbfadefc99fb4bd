"""What counts as a client on this host."""

from __future__ import annotations

import pytest

from appliance.protocol.shared_memory import LocalPeers

LOOPBACK = LocalPeers(["127.0.0.0/8", "::1/128"])


@pytest.mark.parametrize(("client", "connected_to", "local"), [
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.2", "127.0.0.1", True),  # the whole loopback network
    ("::1", "::1", True),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1", True),
    ("192.168.1.20", "192.168.1.5", False),
    ("192.168.1.5", "192.168.1.5", True),  # a process on the box that talks to the box's LAN address
    ("192.168.1.5", None, False),  # an address from X-Forwarded-For proves nothing about the connection
    ("fe80::1%eth0", "fe80::2%eth0", False),
    ("fe80::1%eth0", "fe80::1%eth0", True),
    (None, "127.0.0.1", False),
    ("not an address", "not an address", False),
])
def test_loopback_or_the_connections_own_address(client, connected_to, local):
    assert LOOPBACK.contains(client, connected_to) is local


def test_narrowed_networks_make_other_loopback_addresses_remote():
    narrow = LocalPeers(["127.0.0.1/32"])
    assert narrow.contains("127.0.0.1", "127.0.0.1")
    assert not narrow.contains("127.0.0.2", "127.0.0.1")
    assert LocalPeers([]).contains("127.0.0.1", "127.0.0.1")  # still: from the address it connected to
    assert not LocalPeers([]).contains("127.0.0.2", "127.0.0.1")
