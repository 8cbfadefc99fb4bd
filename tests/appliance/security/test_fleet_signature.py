"""Signed requests (appliance.security.fleet_signature): what a box accepts, and what a signature is good for
in anyone else's hands (nothing: another box, another request, a second time, a minute later)."""

from __future__ import annotations

import hashlib

import pytest

from appliance.core.errors import Unauthorized, Unavailable
from appliance.security.fleet_signature import EMPTY_BODY, FleetVerifier, body_digest, parse, sign

TOKEN = "t0ken-t0ken-t0ken-t0ken-t0ken-32"
BOX = "8d5a3c1e-1111-4222-8333-944445555666"
PATH = "/v2/repository/models/m/load"
BODY = b'{"parameters": {"config": "{}"}}'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def box(clock):
    return FleetVerifier(TOKEN, BOX, ttl=60, clock=clock)


def test_a_signed_request_is_accepted_once_and_binds_its_body(box):
    nonce = box.nonce()
    header = sign(TOKEN, BOX, nonce, "POST", PATH, BODY)
    assert TOKEN not in header
    assert box.verify(header, "POST", PATH) == body_digest(BODY)
    with pytest.raises(Unauthorized, match="used already"):
        box.verify(header, "POST", PATH)  # a replay


def test_a_request_without_a_body_is_signed_for_the_empty_body_and_binds_it(box):
    """No body is the empty body: its digest is signed and must be met like any other, both ways."""
    assert hashlib.sha256(b"").hexdigest() == EMPTY_BODY
    header = sign(TOKEN, BOX, box.nonce(), "POST", PATH)
    assert parse(header).body == EMPTY_BODY and box.verify(header, "POST", PATH) == EMPTY_BODY
    with pytest.raises(Unauthorized, match="not the one its signature covers"):
        FleetVerifier.check_body(EMPTY_BODY, body_digest(BODY))  # signed without a body, sent with one
    with pytest.raises(Unauthorized, match="not the one its signature covers"):
        FleetVerifier.check_body(body_digest(BODY), EMPTY_BODY)  # signed with a body, sent without


@pytest.mark.parametrize("method, path", [
    ("GET", PATH),                                 # another method
    ("POST", "/v2/repository/models/evil/load"),   # another model
    ("POST", PATH + "?x=1"),                       # another target
])
def test_a_signature_is_good_for_exactly_the_request_signed(box, method, path):
    header = sign(TOKEN, BOX, box.nonce(), "POST", PATH, BODY)
    with pytest.raises(Unauthorized, match="does not match"):
        box.verify(header, method, path)


def test_a_signature_under_another_token_is_refused(box):
    header = sign("another-token-another-token-1234", BOX, box.nonce(), "POST", PATH, BODY)
    with pytest.raises(Unauthorized, match="does not match"):
        box.verify(header, "POST", PATH)


def test_a_signature_for_another_box_is_refused_there(box):
    """A fake box that relays a real box's nonce still gets a signature bound to its own id."""
    header = sign(TOKEN, "ffffffff-0000-4000-8000-000000000000", box.nonce(), "POST", PATH, BODY)
    with pytest.raises(Unauthorized, match="signed for box ffffffff"):
        box.verify(header, "POST", PATH)


def test_nonces_are_this_process_own_and_expire(box, clock):
    other = FleetVerifier(TOKEN, BOX, clock=clock)  # the same box after a restart: a new secret
    with pytest.raises(Unauthorized, match="not issued by this box"):
        box.verify(sign(TOKEN, BOX, other.nonce(), "POST", PATH, BODY), "POST", PATH)
    with pytest.raises(Unauthorized, match="not issued by this box"):
        box.verify(sign(TOKEN, BOX, "A" * 48, "POST", PATH, BODY), "POST", PATH)
    nonce = box.nonce()
    clock.now += 61
    with pytest.raises(Unauthorized, match="older than 60 s"):
        box.verify(sign(TOKEN, BOX, nonce, "POST", PATH, BODY), "POST", PATH)
    fresh = box.nonce()
    clock.now += 59
    box.verify(sign(TOKEN, BOX, fresh, "POST", PATH, BODY), "POST", PATH)


def test_used_nonces_are_forgotten_once_expired_and_bounded(clock):
    box = FleetVerifier(TOKEN, BOX, ttl=60, max_used=3, clock=clock)
    for _ in range(3):
        box.verify(sign(TOKEN, BOX, box.nonce(), "GET", "/v2"), "GET", "/v2")
    with pytest.raises(Unavailable, match="more than 3 signed requests"):
        box.verify(sign(TOKEN, BOX, box.nonce(), "GET", "/v2"), "GET", "/v2")
    clock.now += 61
    box.verify(sign(TOKEN, BOX, box.nonce(), "GET", "/v2"), "GET", "/v2")  # the old ones expired


def test_the_body_must_be_the_one_signed():
    FleetVerifier.check_body(body_digest(BODY), body_digest(BODY))
    with pytest.raises(Unauthorized, match="not the one its signature covers"):
        FleetVerifier.check_body(body_digest(BODY), body_digest(BODY + b" "))


@pytest.mark.parametrize("value", [
    'Fleet id="x"',
    'Fleet id="x", nonce="y", body="z", mac="w"',
    'Fleet id="x", nonce="y", body="' + "0" * 64 + '", mac="' + "0" * 64 + '", extra="1"',
    'Fleet id="a b", nonce="y", body="' + "0" * 64 + '", mac="' + "0" * 64 + '"',
    "Fleet " + "x" * 600,
    "Fleet",
])
def test_malformed_signatures_are_401(value):
    with pytest.raises(Unauthorized):
        parse(value)


def test_other_schemes_are_not_signatures():
    assert parse("Bearer abc") is None and parse(None) is None and parse("") is None
    signature = parse(sign(TOKEN, BOX, "bm9uY2U", "GET", "/v2"))
    assert signature is not None and signature.id == BOX and signature.nonce == "bm9uY2U"
