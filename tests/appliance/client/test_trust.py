"""Pinned boxes: which boxes found on the LAN are trusted, why the others are not, and where a pool's
bearer token may go."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import stat

import pytest

from appliance.client.boxes import Box
from appliance.client.trust import TokenPolicy, TrustStore, certificate_fingerprint, same_fingerprint
from appliance.core.errors import ConfigError

REAL = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"


def _box(name="aisle-3", box_id=REAL, addresses=("10.0.0.12",), port=8000) -> Box:
    return Box(name=name, addresses=tuple(addresses), port=port, id=box_id)


@pytest.fixture
def store(tmp_path):
    made = TrustStore.load(tmp_path / "pins" / "trusted-boxes.json")
    made.pin(_box(), REAL)
    made.save()
    return TrustStore.load(made.path)


def test_pins_are_kept_whole_and_private(store):
    assert [(p.name, p.id, p.where) for p in store.pins()] == [("aisle-3", REAL, "10.0.0.12:8000")]
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert json.loads(store.path.read_text())["version"] == 1
    assert [p.name for p in store.path.parent.iterdir()] == ["trusted-boxes.json"]  # no temporary left


def test_a_pinned_box_at_its_address_is_trusted_and_reached_there(store):
    trust = store.verdict(_box(addresses=("192.168.7.7", "10.0.0.12")))  # also announces another address
    assert trust.trusted and trust.box is not None and trust.box.addresses == ("10.0.0.12",)


@pytest.mark.parametrize("box, words", [
    (_box(name="aisle-9", box_id=OTHER, addresses=("10.0.0.99",)), "not pinned"),
    (_box(addresses=("10.0.0.66",)), "now answers at 10.0.0.66:8000, not at 10.0.0.12:8000"),
    (_box(port=8080), "now answers at 10.0.0.12:8080"),
    (_box(box_id=OTHER, addresses=("10.0.0.66",)), f"now says it is box {OTHER}, but it was pinned as box {REAL}"),
    (_box(name="aisle-4", box_id=OTHER), f"the box at 10.0.0.12:8000 now says it is aisle-4 (box {OTHER})"),
    (_box(box_id=""), "now says it is box (no id)"),
])
def test_any_other_box_is_not_trusted_and_the_message_says_how_to_fix_it(store, box, words):
    trust = store.verdict(box)
    assert not trust.trusted and trust.box is None
    assert words in trust.reason
    assert f"appliance fleet trust {box.name}" in trust.reason
    assert trust.changed == (words != "not pinned")


def test_a_box_named_by_address_is_trusted_unless_another_was_pinned_there(store):
    named = Box.at("10.0.0.12:8000")
    assert store.named_verdict(named, REAL).trusted
    refused = store.named_verdict(named, OTHER)
    assert not refused.trusted and refused.changed and "fleet trust --url http://10.0.0.12:8000" in refused.reason
    assert store.named_verdict(Box.at("10.0.0.50:8000"), OTHER).trusted


def test_pinning_again_replaces_the_pin_of_that_name_id_or_address(store):
    store.pin(_box(addresses=("10.0.0.66",)), REAL)  # the box moved: one pin, at its new address
    assert [(p.name, p.where) for p in store.pins()] == [("aisle-3", "10.0.0.66:8000")]
    store.pin(_box(name="aisle-4", box_id=OTHER, addresses=("10.0.0.66",)), OTHER)  # another box took its address
    assert [(p.name, p.id) for p in store.pins()] == [("aisle-4", OTHER)]
    store.pin(_box(name="aisle-4", box_id=REAL), REAL)  # a box that took another's name
    assert [(p.name, p.id, p.where) for p in store.pins()] == [("aisle-4", REAL, "10.0.0.12:8000")]
    with pytest.raises(ConfigError, match="says no box id"):
        store.pin(_box(), "")
    assert [p.name for p in store.unpin(REAL)] == ["aisle-4"] and store.pins() == []


def test_a_damaged_pins_file_is_a_clear_error(tmp_path):
    path = tmp_path / "trusted-boxes.json"
    path.write_text("{")
    with pytest.raises(ConfigError, match="delete the file"):
        TrustStore.load(path)
    path.write_text('{"boxes": [{"name": "x"}]}')
    with pytest.raises(ConfigError, match="not a file of pinned boxes"):
        TrustStore.load(path)
    assert TrustStore.load(tmp_path / "absent.json").pins() == []


def test_a_pool_token_goes_only_to_named_or_pinned_boxes(store):
    following = TokenPolicy("secret", store, named=False)
    pinned = _box(addresses=("192.168.7.7", "10.0.0.12"))
    assert following.token_for(pinned) is None  # the pinned box, but reached at an address it was not pinned at
    routed = following.route(pinned)
    assert routed.addresses == ("10.0.0.12",) and following.token_for(routed) == "secret"
    for stranger in (_box(name="fake", box_id=OTHER, addresses=("10.0.0.66",)), _box(addresses=("10.0.0.66",)),
                     _box(box_id=OTHER)):
        assert following.token_for(stranger) is None and following.route(stranger) == stranger
    assert TokenPolicy("secret", None, named=False).token_for(routed) is None  # no pins: no discovered box
    assert TokenPolicy("secret", None, named=True).token_for(_box(box_id="")) == "secret"  # the app named it
    assert TokenPolicy(None, store, named=False).token_for(routed) is None


FINGERPRINT = "AB:" * 31 + "CD"


def test_a_tls_pin_keeps_its_certificate_and_refuses_the_box_without_tls(tmp_path):
    store = TrustStore.load(tmp_path / "trusted-boxes.json")
    secure = Box(name="aisle-3", addresses=("10.0.0.12",), port=8000, id=REAL, tls=("http",))
    store.pin(secure, REAL, FINGERPRINT)
    store.save()
    store = TrustStore.load(store.path)
    assert [p.fingerprint for p in store.pins()] == [FINGERPRINT]
    trusted = store.verdict(secure)
    assert trusted.trusted and trusted.pin is not None and trusted.pin.fingerprint == FINGERPRINT
    assert trusted.box is not None and trusted.box.base_url == "https://10.0.0.12:8000"
    downgraded = store.verdict(_box())  # the same box, now announcing plain HTTP
    assert not downgraded.trusted and downgraded.changed
    assert "now announces plain HTTP" in downgraded.reason and "appliance fleet trust aisle-3" in downgraded.reason


def test_a_pins_file_without_fingerprints_still_loads(store):
    assert [p.fingerprint for p in store.pins()] == [""]
    document = json.loads(store.path.read_text())
    for pin in document["boxes"]:
        del pin["fingerprint"]  # written before certificates were pinned
    store.path.write_text(json.dumps(document))
    assert TrustStore.load(store.path).verdict(_box()).trusted


def test_fingerprints_compare_in_any_spelling():
    assert same_fingerprint(FINGERPRINT, FINGERPRINT.replace(":", "").lower())
    assert not same_fingerprint(FINGERPRINT, FINGERPRINT.replace("CD", "CE"))
    assert not same_fingerprint("", "")  # no certificate is never a match
    assert certificate_fingerprint(b"der") == ":".join(f"{b:02X}" for b in hashlib.sha256(b"der").digest())


def test_a_box_announced_or_named_with_tls_is_reached_over_https():
    assert Box.at("https://10.0.0.12:8000").base_url == "https://10.0.0.12:8000"
    assert Box.at("https://10.0.0.12:8000").url == "10.0.0.12:8000"
    assert Box.at("http://10.0.0.12:8000").base_url == "http://10.0.0.12:8000"


def test_a_name_that_resolves_to_a_pinned_address_is_at_that_pin(tmp_path):
    store = TrustStore.load(tmp_path / "trusted-boxes.json")
    store.pin(_box(addresses=("127.0.0.1",)), REAL, FINGERPRINT)
    for named in ("localhost:8000", "https://localhost:8000", "127.0.0.1:8000"):
        pin = store.pinned_at(Box.at(named))
        assert pin is not None and (pin.id, pin.address, pin.fingerprint) == (REAL, "127.0.0.1", FINGERPRINT)
    assert store.pinned_at(Box.at("localhost:8001")) is None and store.pinned_at(Box.at("127.0.0.2:8000")) is None
    legacy = TrustStore(store.path, [dataclasses.replace(store.pins()[0], address="localhost")])  # pinned by name
    pin = legacy.pinned_at(Box.at("127.0.0.1:8000"))
    assert pin is not None and pin.address == "127.0.0.1"
    assert not legacy.named_verdict(Box.at("https://127.0.0.1:8000"), OTHER).trusted  # another box, at its number


def test_a_box_named_by_url_that_says_it_is_a_tls_pinned_box_must_present_its_certificate(tmp_path):
    store = TrustStore.load(tmp_path / "trusted-boxes.json")
    store.pin(_box(), REAL, FINGERPRINT)  # aisle-3 at 10.0.0.12:8000, with TLS
    elsewhere = Box.at("https://10.0.0.50:8000")
    assert store.named_verdict(elsewhere, REAL, FINGERPRINT.replace(":", "")).trusted  # its key, at another address
    forged = store.named_verdict(elsewhere, REAL, "EE:" * 31 + "EE")
    assert not forged.trusted and forged.changed
    assert f"presents the TLS certificate {'EE:' * 31}EE, not {FINGERPRINT}" in forged.reason
    assert "appliance fleet trust --url https://10.0.0.50:8000" in forged.reason
    plain = store.named_verdict(Box.at("http://10.0.0.50:8000"), REAL, "", again="appliance fleet trust --url X")
    assert not plain.trusted and "answers plain HTTP" in plain.reason and plain.reason.endswith("--url X")
    assert not store.named_verdict(Box.at("10.0.0.12:8000"), REAL, "").trusted  # its address, without TLS
    assert store.named_verdict(elsewhere, OTHER, "EE:" * 31 + "EE").trusted  # not a pinned box: the URL names it


def test_a_box_named_by_url_that_says_it_is_a_plain_pinned_box_must_answer_at_its_address(store):
    assert store.named_verdict(Box.at("localhost:8000"), OTHER).trusted
    moved = store.named_verdict(Box.at("10.0.0.50:8000"), REAL)
    assert not moved.trusted and moved.changed and "pinned at 10.0.0.12:8000 over plain HTTP" in moved.reason
    assert store.named_verdict(Box.at("10.0.0.12:8000"), REAL).trusted
