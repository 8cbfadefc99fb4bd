"""A box merely found on the LAN is not trusted: a fake box, and an impostor announcing a real box's id,
beside a real box that exempts no address, inside a private network namespace (multicast never leaves
it). The scenario is fake_box_scenario.py.

The fake box logs every header it receives and then replays all of it to the real box: it must never
see the token, and nothing it saw may make the real box load anything. Pushes to the pinned real box
work (signed); a pinned box that moves is refused until it is pinned again.
"""

from __future__ import annotations

import json

import pytest

from tests.appliance.mdns.fake_box_scenario import TOKEN
from tests.appliance.mdns.netns import run_scenario


@pytest.fixture(scope="module")
def lan():
    return run_scenario("tests.appliance.mdns.fake_box_scenario", "fleet trust tests", timeout=300)


def test_the_fake_box_never_sees_the_token(lan):
    for request in lan["seen"]:
        for name, value in request["headers"].items():
            assert TOKEN not in value and "Bearer" not in value, (name, value)


def test_boxes_merely_found_are_never_contacted_by_a_push(lan):
    push = lan["push_all"]
    assert push["rc"] == 1, push
    assert "box-real: n loaded in" in push["stdout"]
    assert "box-fake: not pushed: box-fake (127.0.0.1:" in push["stdout"]
    assert "not pinned" in push["stdout"] and "appliance fleet trust box-fake" in push["stdout"]
    assert (f"box-imp (box {lan['real_id']}) now answers at 127.0.0.1:{lan['fake_port']}, not at "
            f"127.0.0.1:{lan['real_port']} where it was pinned") in push["stdout"]
    assert not [r for r in lan["seen_before_pinning"] if "Authorization" in r["headers"] or "/load" in r["path"]]


def test_appliance_fleet_reads_every_box_and_says_which_are_trusted(lan):
    assert lan["fleet"]["rc"] == 0, lan["fleet"]
    rows = {row["name"]: row for row in json.loads(lan["fleet"]["stdout"])}
    assert (rows["box-real"]["trust"], rows["box-fake"]["trust"], rows["box-imp"]["trust"]) == (
        "pinned", "no", "CHANGED")
    assert rows["box-real"]["error"] is None and rows["box-real"]["models_ready"] == 1
    assert "now answers at" in rows["box-imp"]["error"]


def test_what_a_pinned_fake_box_receives_replays_to_nothing(lan):
    """Even pinned by mistake, the fake box gets a signature bound to its own id, over a nonce it relayed
    from the real box: replayed as is, or with the real box's id, the real box refuses it."""
    assert lan["trust_fake"]["rc"] == 0 and lan["push_fake"]["rc"] == 0
    signed = [r for r in lan["seen"] if "Authorization" in r["headers"]]
    assert signed and all(r["headers"]["Authorization"].startswith("Fleet ") for r in signed)
    loads = [r for r in lan["replayed"] if "/load" in r["path"]]
    assert loads and all(r["status"] == 401 for r in loads), loads
    assert any(r.get("forged") for r in loads)
    assert "stolen" not in lan["real_models"] and "n" in lan["real_models"]


def test_a_pinned_box_that_moves_is_refused_until_pinned_again(lan):
    moved = lan["push_moved"]
    assert moved["rc"] == 1 and f"now answers at 127.0.0.1:{lan['new_port']}" in moved["stdout"], moved
    assert "appliance fleet trust box-real" in moved["stdout"]
    assert lan["trust_again"]["rc"] == 0
    assert lan["push_again"]["rc"] == 0, lan["push_again"]
    assert "moved" in lan["real_models_after"]
