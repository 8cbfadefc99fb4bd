"""A box serving TLS on the LAN, inside a private network namespace (multicast never leaves it): its
record says which ports speak TLS; `appliance fleet trust` pins the certificate it presents; the same box
presenting another certificate, or none (plain HTTP), is refused by `appliance fleet` and `appliance push`
until it is pinned again. The scenario is tls_scenario.py."""

from __future__ import annotations

import pytest

from tests.appliance.mdns.netns import run_scenario

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lan():
    return run_scenario("tests.appliance.mdns.tls_scenario", "TLS fleet tests", timeout=240)


def test_the_record_says_both_ports_speak_tls(lan):
    assert lan["discovered"] == {"tls": ["http", "grpc"], "url": f"https://127.0.0.1:{lan['port']}"}
    header, row = lan["discover_table"].splitlines()[:2]
    assert header.split()[4] == "tls" and row.split()[0] == "box-tls" and row.split()[4] == "http,grpc", row


def test_trust_pins_the_certificate_the_box_presents(lan):
    assert lan["trust"]["rc"] == 0, lan["trust"]
    assert f"TLS certificate SHA-256 {lan['first']}" in lan["trust"]["stdout"]
    (pin,) = lan["pins"]["boxes"]
    assert pin["fingerprint"] == lan["first"] and pin["port"] == lan["port"]
    row = lan["fleet_pinned"]
    assert row["trust"] == "pinned" and row["error"] is None and row["models_ready"] == 1, row
    assert row["url"] == f"https://127.0.0.1:{lan['port']}"


def test_the_pinned_box_with_another_certificate_is_refused(lan):
    row = lan["fleet_changed"]
    assert row["trust"] == "CHANGED" and row["models_ready"] is None, row
    assert f"presents the TLS certificate {lan['second']}, but it was pinned with {lan['first']}" in row["error"]
    push = lan["push_changed"]
    assert push["rc"] == 1 and "not pushed" in push["stdout"] and "appliance fleet trust box-tls" in push["stdout"]


def test_the_pinned_box_in_plain_http_is_refused(lan):
    row = lan["fleet_plain"]
    assert row["trust"] == "CHANGED" and "now announces plain HTTP" in row["error"], row
    push = lan["push_plain"]
    assert push["rc"] == 1 and "now announces plain HTTP" in push["stdout"], push
