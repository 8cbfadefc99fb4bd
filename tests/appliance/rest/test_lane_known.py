"""KnownHead: the next head taken without llhttp only where llhttp would read it as the known one with other
lengths; everything else is left to a fresh read (hostile cases, and a hypothesis property against
HeadReader itself)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.rest.lane_head import HeadReader, HeadRefused
from appliance.rest.lane_known import KnownHead
from appliance.rest.lane_wire import LaneHead, lane_request

MAX_BODY = 64 << 10


def _head(length: bytes = b"109", header_length: bytes | None = b"105", target: bytes = b"/v2/models/m/infer",
          extra: bytes = b"") -> bytes:
    fields = b"Host: 127.0.0.1:8000\r\nAccept: */*\r\n"
    if header_length is not None:
        fields += b"Inference-Header-Content-Length: " + header_length + b"\r\n"
    return (b"POST " + target + b" HTTP/1.1\r\n" + fields + extra + b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: " + length + b"\r\n\r\n")


def _read(raw: bytes) -> tuple[int, LaneHead | None] | None:
    """What a fresh read makes of ``raw``: its head's length and the lane head (None: not the lane's), or
    None where it is refused or still coming."""
    reader = HeadReader()
    try:
        end = reader.feed(bytearray(raw))
    except HeadRefused:
        return None
    if not end:
        return None
    return end, lane_request(reader, MAX_BODY)


def _known(raw: bytes) -> KnownHead:
    read = _read(raw)
    assert read is not None and read[1] is not None
    return KnownHead(raw, read[1], MAX_BODY)


def _same(a: LaneHead, b: LaneHead) -> bool:
    return ((a.operation, a.method, a.target, a.model, a.version, a.length, a.close, list(a.headers.items()))
            == (b.operation, b.method, b.target, b.model, b.version, b.length, b.close, list(b.headers.items())))


def test_the_same_bytes_give_the_same_head():
    raw = _head()
    known = _known(raw)
    assert known.next_head(raw + b"body") == (len(raw), known.head)


def test_other_lengths_give_the_head_a_fresh_read_gives_and_keep_what_was_made_of_the_client():
    known = _known(_head())
    known.head.caller, known.head.named, known.head.proof = "caller", "named", "proof"  # type: ignore[assignment]
    raw = _head(b"20000", b"7")
    end, head = known.next_head(bytearray(raw + b"x" * 10))
    fresh = _read(raw)
    assert fresh is not None and fresh[1] is not None
    assert end == len(raw) == fresh[0] and _same(head, fresh[1])
    assert head.length == 20000 and head.headers["Inference-Header-Content-Length"] == "7"
    assert (head.caller, head.named, head.proof) == ("caller", "named", "proof")
    assert known.raw == raw and known.head is head  # from now on the known head


def test_a_head_without_the_varying_fields_is_known_only_byte_for_byte():
    known = _known(_head(header_length=None))
    assert known.next_head(_head(b"110", header_length=None)) is not None
    get = b"GET /v2/models/m/ready HTTP/1.1\r\nHost: h\r\n\r\n"
    read = _read(get)
    assert read is not None and read[1] is not None
    reads = KnownHead(get, read[1], MAX_BODY)
    assert reads.next_head(get) == (len(get), read[1])
    assert reads.next_head(get.replace(b"ready", b"config")) is None


@pytest.mark.parametrize("length", [b"+5", b"-1", b"1 2", b"12 ", b" 12", b"0x10", b"1_0", b"\xd9\xa1", b"",
                                    b"1" * 16, b"99999999999999"])
def test_a_value_that_is_not_bare_digits_within_bounds_is_read_afresh(length):
    known = _known(_head())
    assert known.next_head(_head(length)) is None
    assert known.next_head(_head(b"109", length)) is None or length.isdigit() and len(length) <= 15


def test_a_content_length_past_the_lane_bound_is_read_afresh():
    known = _known(_head())
    assert known.next_head(_head(str(MAX_BODY + 1).encode())) is None
    assert known.next_head(_head(str(MAX_BODY).encode())) is not None


@pytest.mark.parametrize("other", [
    _head(target=b"/v2/models/n/infer"),
    _head(extra=b"Connection: close\r\n"),
    _head().replace(b"Accept: */*", b"Accept: */+"),
    _head().replace(b"Content-Length: 109\r\n", b"Content-Length: 109\r\nContent-Length: 109\r\n"),
    _head().replace(b"\r\n\r\n", b"\r\nX: 1\r\n\r\n"),
    _head()[:-2],  # still coming
    _head().replace(b"Content-Length: 109", b"Content-Length: 109\n"),
])
def test_any_other_difference_is_read_afresh(other):
    assert _known(_head()).next_head(other) is None


def test_a_head_with_a_varying_field_twice_is_known_only_byte_for_byte():
    raw = _head(extra=b"Inference-Header-Content-Length: 105\r\n")
    known = _known(raw)
    assert known.next_head(raw) is not None
    assert known.next_head(_head(extra=b"Inference-Header-Content-Length: 106\r\n")) is None


_NOISE = st.sampled_from([b"0", b"7", b"12", b" ", b"\t", b"+", b"-", b"a", b"\r", b"\n", b"\r\n", b":", b"\x00",
                          b"\xff", b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.binary(max_size=18) | st.integers(0, 10**15).map(lambda n: str(n).encode()),
       header_length=st.binary(max_size=18) | st.integers(0, 10**17).map(lambda n: str(n).encode()),
       cut=st.integers(0, 400), noise=st.lists(_NOISE, max_size=3), lower=st.booleans())
def test_whatever_it_takes_a_fresh_read_takes_as_the_same_head(length, header_length, cut, noise, lower):
    base = _head()
    if lower:
        base = base.replace(b"Inference-Header-Content-Length", b"inference-header-content-length")
    known = _known(base)
    raw = _head(length, header_length)
    if lower:
        raw = raw.replace(b"Inference-Header-Content-Length", b"inference-header-content-length")
    cut = min(cut, len(raw))
    data = raw[:cut] + b"".join(noise) + raw[cut:]
    taken = known.next_head(data)
    if taken is None:
        return
    end, head = taken
    fresh = _read(data[:end])
    assert fresh is not None and fresh[1] is not None, data
    assert fresh[0] == end and _same(head, fresh[1]), data
