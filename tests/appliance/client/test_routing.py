"""The routing policy alone (no network): candidates, power of two choices by cost, cooling down, and
when waiting for a box is pointless."""

from __future__ import annotations

import random

import pytest
from tritonclient.utils import InferenceServerException

from appliance.client import Box
from appliance.client.routing import NoBoxAvailable, Router
from appliance.client.transport import Refused, Unreachable, classify_grpc, classify_http, ready_models


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _box(name: str, grpc: bool = True) -> Box:
    return Box(name=name, addresses=("10.0.0.1",), port=8000 + len(name), grpc_port=9000 if grpc else None)


def _router(*names: str, models: frozenset = frozenset({"m"}), **options) -> tuple[Router, Clock]:
    clock = Clock()
    router = Router(rng=random.Random(7), clock=clock, **options)
    for name in names:
        router.add(_box(name))
        router.set_models(name, models)
    return router, clock


def test_only_boxes_with_the_model_ready_are_candidates():
    router, _ = _router("a", "b")
    router.add(_box("c"))  # its models are not known yet
    router.set_models("b", {"other"})
    assert {router.choose("m", "http", set()).name for _ in range(20)} == {"a"}
    assert router.choose("other", "http", set()).name == "b"


def test_protocol_the_box_does_not_serve_is_not_a_candidate():
    router, _ = _router()
    router.add(_box("http-only", grpc=False))
    router.set_models("http-only", {"m"})
    assert router.choose("m", "grpc", set()) is None
    assert router.choose("m", "http", set()).name == "http-only"


def test_the_box_with_fewer_outstanding_requests_wins():
    router, _ = _router("a", "b")
    for _ in range(3):
        assert router.choose("m", "http", {"b"}).name == "a"  # three requests outstanding on a
    assert [router.choose("m", "http", set()).name for _ in range(3)] == ["b", "b", "b"]


def test_a_slower_box_gets_less():
    router, _ = _router("fast", "slow")
    router.choose("m", "http", {"slow"})
    router.succeeded("fast", "m", 0.001)
    router.choose("m", "http", {"fast"})
    router.succeeded("slow", "m", 0.100)
    picks = []
    for _ in range(6):  # outstanding piles up on fast before slow's cost is lower
        picks.append(router.choose("m", "http", set()).name)
    assert picks.count("fast") >= 5


def test_a_box_passed_over_is_tried_again_as_its_estimate_decays():
    router, clock = _router("fast", "cold")
    router.choose("m", "http", {"fast"})
    router.succeeded("cold", "m", 0.500)  # one slow first call (a channel being set up)
    picks = []
    for _ in range(60):  # a request a second, each answered in 1 ms
        box = router.choose("m", "http", set())
        picks.append(box.name)
        router.succeeded(box.name, "m", 0.001)
        clock.now += 1
    # cold, 500x slower on paper, is passed over until its estimate, refreshed by no request, has decayed
    # below fast's (5 s x ln 500, about 31 s), then tried, and its new sample keeps it in the running.
    assert picks[:25] == ["fast"] * 25 and "cold" in picks[25:40] and picks[40:].count("cold") > 5


def test_power_of_two_choices_spreads_over_many_boxes():
    router, _ = _router(*"abcdefgh")
    counts: dict[str, int] = {}
    latencies = random.Random(3)
    for _ in range(8000):
        name = router.choose("m", "http", set()).name
        counts[name] = counts.get(name, 0) + 1
        router.succeeded(name, "m", latencies.uniform(0.009, 0.011))  # equal boxes, noisy measurements
    assert set(counts) == set("abcdefgh")
    assert all(800 <= count <= 1200 for count in counts.values()), counts  # within 20 % of even


def test_an_unreachable_box_cools_down_for_cooldown_seconds():
    router, clock = _router("a", "b", cooldown=30)
    router.choose("m", "http", {"b"})
    router.unreachable("a")
    assert {router.choose("m", "http", set()).name for _ in range(5)} == {"b"}
    clock.now += 31
    assert "a" in {router.choose("m", "http", set()).name for _ in range(10)}


def test_a_lost_connection_does_not_cool_the_box():
    router, _ = _router("a", cooldown=30)
    router.choose("m", "http", set())
    router.unreachable("a", cool=False)
    assert router.choose("m", "http", set()).name == "a"


def test_a_busy_box_pauses_for_its_retry_after_bounded_by_busy_backoff():
    router, clock = _router("a", busy_backoff=0.25)
    router.choose("m", "http", set())
    router.refused("a", retry_after=1.0)
    assert router.choose("m", "http", set()) is None
    assert router.next_free("m", "http") == pytest.approx(0.25)
    clock.now += 0.3
    assert router.choose("m", "http", set()).name == "a"


def test_pause_says_when_waiting_cannot_help():
    router, _ = _router("a")
    with pytest.raises(NoBoxAvailable, match="no box has model 'x' READY"):
        router.pause("x", "http", set(), 10.0, None)
    tried = {"a"}
    assert router.pause("m", "http", tried, 10.0, None) == pytest.approx(0.05)
    assert tried == set()  # every box was tried: they may be tried again
    with pytest.raises(NoBoxAvailable, match="within the retry deadline; last error: boom"):
        router.pause("m", "http", {"a"}, 0.01, RuntimeError("boom"))


def test_a_box_not_read_yet_makes_the_pool_wait_rather_than_fail():
    router, _ = _router()
    router.add(_box("new"))
    assert router.pause("m", "http", set(), 10.0, None) == pytest.approx(0.05)


def test_a_changed_record_asks_for_a_new_read_of_the_models():
    router, _ = _router("a")
    box = _box("a")
    assert router.add(box) is False
    assert router.add(Box(**{**box.__dict__, "catalog": "1234abcd"})) is True


def test_outstanding_counts_come_back_to_zero():
    router, _ = _router("a")
    for outcome in ("succeeded", "failed", "refused", "unreachable", "missing"):
        router.choose("m", "http", set())
        {"succeeded": lambda: router.succeeded("a", "m", 0.01), "failed": lambda: router.failed("a"),
         "refused": lambda: router.refused("a", None), "unreachable": lambda: router.unreachable("a", False),
         "missing": lambda: router.missing("a", "m")}[outcome]()
        router.set_models("a", {"m"})
        router._boxes["a"].down_until = 0  # noqa: SLF001 - reset between outcomes
    assert router.snapshot()["a"]["outstanding"] == 0


def test_what_an_http_answer_means():
    assert isinstance(classify_http(503, b'{"error": "full"}', {"Retry-After": "2"}, "a"), Refused)
    assert classify_http(503, b"{}", {"Retry-After": "2"}, "a").retry_after == 2.0
    assert classify_http(404, b'{"error": "unknown model"}', {}, "a").missing
    for status in (400, 401, 500):
        error = classify_http(status, b'{"error": "no"}', {}, "a")
        assert isinstance(error, InferenceServerException) and error.status() == str(status)


def test_what_a_grpc_status_means():
    def grpc(status: str, message: str) -> Exception:
        return classify_grpc(InferenceServerException(msg=message, status=status), "a")

    assert grpc("StatusCode.UNAVAILABLE", "failed to connect to all addresses").cool
    assert isinstance(grpc("StatusCode.UNAVAILABLE", "Socket closed"), Unreachable)
    assert not grpc("StatusCode.UNAVAILABLE", "Socket closed").cool
    assert isinstance(grpc("StatusCode.UNAVAILABLE", "model queue is full"), Refused)
    assert grpc("StatusCode.NOT_FOUND", "unknown model").missing
    for status in ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL", "StatusCode.DEADLINE_EXCEEDED"):
        assert isinstance(grpc(status, "no"), InferenceServerException)


def test_ready_models_of_an_index():
    rows = [{"name": "a", "state": "READY"}, {"name": "b", "state": "UNAVAILABLE"}, {"name": "a", "state": "READY"}]
    assert ready_models(rows) == {"a"}
    with pytest.raises(ValueError):
        ready_models({"error": "x"})


def test_a_box_whose_index_cannot_be_read_is_named_when_no_box_has_the_model():
    router, _ = _router("a")
    router.add(_box("locked"))
    router.index_failed("locked", "cannot read its repository index (HTTP 401: token required)")
    with pytest.raises(NoBoxAvailable, match="models unknown on locked: .*HTTP 401"):
        router.pause("x", "http", set(), 10.0, None)


def test_a_sequence_stays_on_the_box_it_started_on_until_it_ends():
    router, _ = _router("a", "b", "c")
    first = router.choose("m", "http", set(), sequence=("m", "", 7)).name
    router.succeeded(first, "m", 0.001)
    for _ in range(20):  # however loaded that box gets meanwhile
        assert router.choose("m", "http", set(), sequence=("m", "", 7)).name == first
    for name in "abc":  # nothing outstanding any more
        while router.snapshot()[name]["outstanding"]:
            router.succeeded(name, "m", 0.001)
    others = set()
    for n in range(100, 160):
        chosen = router.choose("m", "http", set(), sequence=("m", "", n)).name
        router.succeeded(chosen, "m", 0.001)
        others.add(chosen)
    assert len(others) == 3  # other sequences still spread
    router.unpin(("m", "", 7))
    assert {router.choose("m", "http", {first}, sequence=("m", "", 7)).name} <= {"a", "b", "c"} - {first}


def test_a_sequence_whose_box_is_gone_goes_elsewhere_and_stays_there():
    router, _ = _router("a", "b")
    first = router.choose("m", "http", set(), sequence="s").name
    router.remove(first)
    second = router.choose("m", "http", set(), sequence="s").name
    assert second != first
    router.add(_box(first))
    router.set_models(first, {"m"})
    assert all(router.choose("m", "http", set(), sequence="s").name == second for _ in range(10))
