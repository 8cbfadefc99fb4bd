"""A fleet end to end, inside a private network namespace made by the test (multicast never leaves it):
`appliance push` to every box and to some, a live BoxPool sending 3,000 requests from 8 threads while
one box is killed half-way and another is saturated, hostile pushes, `appliance fleet` and the
dashboard's fleet panel. The scenario is fleet_scenario.py.

"Even", with a saturated box: box-b takes one request at a time and refuses the rest (503 +
Retry-After), so its fair share is what it can take, not a third. The boxes that stayed up and were
not saturated (box-c, box-d) must each have served within ±20 % of their mean of the requests for "m",
the model every box has ("n" can only go to box-a and box-c); box-b less than that mean, with every
request it refused served elsewhere; box-a its share until it was killed. Counted by the boxes' own
statistics (which must agree with the pool's). "m" is a Python model that takes 4 ms a request on
every box, so that the boxes are equal however the two shared cores of a test machine are scheduled.
"""

from __future__ import annotations

import pytest

from tests.appliance.mdns.netns import run_scenario

# The scenario starts real daemons in a private network namespace.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet():
    return run_scenario("tests.appliance.mdns.fleet_scenario", "fleet tests", timeout=480, stderr_tail=5000)


def test_push_refuses_boxes_merely_found_until_they_are_pinned(fleet):
    refused = fleet["push_unpinned"]
    assert refused["rc"] == 1, refused
    for name in ("box-a", "box-b", "box-c", "box-d"):
        assert f"{name}: not pushed: {name} (127.0.0.1:" in refused["stdout"]
        assert f"appliance fleet trust {name}" in refused["stdout"]
    assert "pushing" not in refused["stdout"]  # nothing was sent to any of them
    trusted = fleet["trust_all"]
    assert trusted["rc"] == 0, trusted
    assert sorted(line.split()[1].rstrip(":") for line in trusted["stdout"].splitlines()
                  if line.startswith("pinned ")) == ["box-a", "box-b", "box-c", "box-d"]


def test_push_all_loads_the_model_on_every_box_with_a_line_each(fleet):
    push = fleet["push_all"]
    assert push["rc"] == 0, push
    for name in ("box-a", "box-b", "box-c", "box-d"):
        assert f"{name}: m loaded in" in push["stdout"]
    assert "m loaded on 4 box(es)" in push["stdout"]
    assert fleet["push_some"]["rc"] == 0 and "n loaded on 2 box(es)" in fleet["push_some"]["stdout"]
    assert {name: index.get("m") for name, index in fleet["index"].items()} == dict.fromkeys(fleet["ports"], "pushed")
    assert {name for name, index in fleet["index"].items() if "n" in index} == {"box-a", "box-c"}


def test_push_to_a_box_that_is_not_there_fails_naming_it(fleet):
    assert fleet["push_unknown"]["rc"] == 2
    assert "no box named box-z" in fleet["push_unknown"]["stderr"]


def test_hostile_pushes_are_refused_and_leave_nothing(fleet):
    assert fleet["hostile"] == {"dotdot": 400, "absolute": 400, "oversized": 413, "no_token": 401}
    assert fleet["box_d_files"] == ["m/1/model.py", "m/config.pbtxt", "origin.json"]
    assert fleet["escaped"] == []


def test_the_pool_found_the_boxes_and_their_models_over_mdns(fleet):
    assert fleet["pool_models"] == {"box-a": ["m", "n"], "box-b": ["m"], "box-c": ["m", "n"], "box-d": ["m"]}


def test_no_request_failed_though_a_box_died_and_another_was_full(fleet):
    run = fleet["run"]
    assert run["killed_at"] == [1500]
    assert run["failed"] == 0, run["failures"]
    assert run["seconds"] < 60
    pool = fleet["pool"]
    assert sum(sum(s["served"].values()) for s in pool.values()) == 3000
    assert pool["box-b"]["refused"] > 0  # saturated: it said 503, and the request went elsewhere
    assert pool["box-a"]["unreachable"] > 0  # killed: the requests it lost went elsewhere


def test_a_box_without_the_model_gets_none_of_its_requests(fleet):
    pool, served = fleet["pool"], fleet["served"]
    assert "n" not in pool["box-b"]["served"] and "n" not in pool["box-d"]["served"]
    assert served["box-b"]["n"] is None and served["box-d"]["n"] is None  # the boxes never had it
    assert pool["box-c"]["served"]["n"] + pool["box-a"]["served"].get("n", 0) == 300


def test_load_over_the_surviving_boxes_is_even(fleet):
    served, pool = fleet["served"], fleet["pool"]
    for name, counts in served.items():  # the boxes' own statistics agree with the pool's
        assert counts["m"] == pool[name]["served"]["m"]
        assert (counts["n"] or 0) == pool[name]["served"].get("n", 0)
    even = (served["box-c"]["m"] + served["box-d"]["m"]) / 2
    for name in ("box-c", "box-d"):
        assert 0.8 * even <= served[name]["m"] <= 1.2 * even, served
    assert served["box-b"]["m"] < even, served
    assert pool["box-a"]["served"]["m"] > 0


def test_appliance_fleet_lists_every_box(fleet):
    """Run after box-b stopped (goodbye) and box-e joined."""
    rows = {row["name"]: row for row in fleet["fleet"]}
    assert {"box-c", "box-d", "box-e"} <= set(rows) and "box-b" not in rows
    for name in ("box-c", "box-d", "box-e"):
        row = rows[name]
        assert row["error"] is None and row["version"] and row["hw"] and row["trusted"] and row["trust"] == "pinned"
        assert row["address"].startswith("127.0.0.1:")
    assert rows["box-d"]["address"] == f"127.0.0.1:{fleet['ports']['box-d']}"
    assert (rows["box-c"]["models_ready"], rows["box-c"]["models_total"]) == (2, 2)
    assert (rows["box-d"]["models_ready"], rows["box-d"]["models_total"]) == (1, 1)
    assert rows["box-c"]["requests_per_s"] > 0 and rows["box-c"]["p50_ms"] > 0
    if "box-a" in rows:  # killed without a goodbye: listed until its record expires, as unreachable
        assert "unreachable" in rows["box-a"]["error"]


def test_the_dashboard_fleet_panel_lists_the_boxes_with_links(fleet):
    panel = fleet["panel"]
    assert panel["mdns"] is True
    boxes = {box["name"]: box for box in panel["boxes"]}
    assert {"box-c", "box-d", "box-e"} <= set(boxes) and "box-b" not in boxes
    assert boxes["box-c"]["self"] is True and boxes["box-d"]["self"] is False
    assert boxes["box-d"]["dashboard"] == f"http://127.0.0.1:{fleet['ports']['box-d']}/"
    assert fleet["dashboard_has_panel"]


def test_the_pool_follows_boxes_coming_and_going(fleet):
    seen = fleet["coming_and_going"]
    assert seen["b_left_after"] is not None  # its goodbye removed it from the pool
    assert seen["e_joined_after"] is not None and seen["e_models_before_push"] == []
    assert seen["trust_e"] == 0 and seen["push_e"] == 0
    assert seen["e_models_read_after"] is not None  # the record's new digest made the pool read it again
    assert seen["answers"] == [2.0]
    assert seen["served"]["box-e"] > 0 and "box-b" not in seen["served"]


def test_the_async_pool_follows_the_lan_too(fleet):
    result = fleet["async_pool"]
    assert result["answers"] == ["4.0"]
    assert sum(result["served"].values()) == 200
    assert {name for name, count in result["served"].items() if count} <= {"box-c", "box-d", "box-e"}
