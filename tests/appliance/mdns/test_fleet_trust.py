"""A box merely found on the LAN is not trusted: a fake box, and an impostor announcing a real box's id,
beside a real box that exempts no address, inside a private network namespace (multicast never leaves
it). The scenario is fake_box_scenario.py.

The fake box logs every header it receives and then replays all of it to the real box: it must never
see the token, and nothing it saw may make the real box load anything. Pushes to the pinned real box
work (signed), `appliance fleet` reads it (signed: it protects inference), a BoxPool gives its bearer
token to it only when it is pinned; a pinned box that moves is refused until it is pinned again.
"""

from __future__ import annotations

import json

import pytest

from tests.appliance.mdns.fake_box_scenario import TOKEN
from tests.appliance.mdns.netns import run_scenario

pytestmark = pytest.mark.e2e


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
    assert rows["box-real"]["error"] is None and rows["box-real"]["models_ready"] == 1  # read signed: it protects
    assert rows["box-real"]["version"] and rows["box-real"]["hw"]
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


def test_a_pool_sends_its_token_to_pinned_boxes_only(lan):
    """box-real protects inference: a BoxPool with the token and the pins is served by it; without the
    pins the token goes to no box found on the LAN, so box-real refuses the pool (401, token needed)."""
    pinned, unpinned = lan["pool_pinned"], lan["pool_unpinned"]
    assert pinned["answers"] == [0.0, 5.0, 10.0, 15.0, 20.0], pinned
    assert pinned["stats"]["box-real"]["served"] == {"n": 5}
    assert "needs 'Authorization: Bearer <token>'" in unpinned["stats"]["box-real"]["index_error"], unpinned
    assert all(isinstance(answer, str) and "NoBoxAvailable" in answer for answer in unpinned["answers"])
    index_reads = [r for r in lan["seen_before_pinning"] if r["path"] == "/v2/repository/index"]
    assert index_reads and not [r for r in index_reads if "Authorization" in r["headers"]]
