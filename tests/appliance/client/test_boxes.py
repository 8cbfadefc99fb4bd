"""What a box's mDNS record says of it: the ports that speak TLS (TXT ``tls``), read back as the announcer
writes them, and the URLs a client then uses."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from appliance.client.boxes import KSERVE_TYPE, Box, parse_box
from appliance.mdns.announcer import txt_record


def _announced(**record: object) -> Box:
    properties = {k.encode(): v.encode() for k, v in txt_record("id-1", ["cpu"], 1, **record).items()}  # type: ignore[arg-type]
    info = SimpleNamespace(name=f"aisle-3.{KSERVE_TYPE}", addresses=[socket.inet_aton("10.0.0.12")], port=8000,
                           properties=properties)
    box = parse_box(info)
    assert box is not None
    return box


@pytest.mark.parametrize("tls, base_url", [
    ((), "http://10.0.0.12:8000"),
    (("http",), "https://10.0.0.12:8000"),
    (("grpc",), "http://10.0.0.12:8000"),
    (("http", "grpc"), "https://10.0.0.12:8000"),
])
def test_the_record_says_which_ports_speak_tls(tls, base_url):
    box = _announced(grpc_port=8001, tls=tls)
    assert box.tls == tls and box.base_url == base_url and box.grpc_url == "10.0.0.12:8001"


def test_unknown_words_in_the_tls_key_are_ignored():
    info = SimpleNamespace(name=f"x.{KSERVE_TYPE}", addresses=[socket.inet_aton("10.0.0.12")], port=8000,
                           properties={b"id": b"id-1", b"tls": b"smtp,http,"})
    box = parse_box(info)
    assert box is not None and box.tls == ("http",)


def test_a_box_named_by_an_https_url_speaks_tls():
    assert Box.at("https://10.0.0.12:8000").tls == ("http",)
    assert Box.at("https://10.0.0.12:8000/").url == "10.0.0.12:8000"
    assert Box.at("10.0.0.12:8000").tls == () == Box.at("http://10.0.0.12:8000").tls
    with pytest.raises(ValueError, match="expected host:port"):
        Box.at("https://10.0.0.12")
