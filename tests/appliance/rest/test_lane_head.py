"""The infer lane's head reader (``appliance.rest.lane_head``): llhttp's parsing plus the lane's bounds and
HTTP/1.1's Host rule; what it refuses, with which status, and that it never reads past a head."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.rest.lane_head import LANE_HEAD_BYTES, LANE_LINE_BYTES, LANE_MAX_FIELDS, HeadReader, HeadRefused

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
INFER = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n"


def _feed(*pieces: bytes) -> tuple[HeadReader, int]:
    """Feed ``pieces`` one after another into one buffer, as a connection receives them."""
    reader, buffer, end = HeadReader(), bytearray(), 0
    for piece in pieces:
        buffer += piece
        end = reader.feed(buffer)
    return reader, end


def _refusal(*pieces: bytes) -> HeadRefused:
    with pytest.raises(HeadRefused) as caught:
        _feed(*pieces)
    return caught.value


def test_a_head_is_read_to_its_blank_line_and_no_further():
    reader, end = _feed(INFER + b"hello" + LIVE)
    assert end == len(INFER)
    assert (reader.method, reader.target, reader.version, reader.keep_alive) == (
        b"POST", b"/v2/models/simple/infer", "1.1", True)
    assert reader.noted[b"content-length"] == b"5"


def test_a_head_split_anywhere_reads_the_same():
    for cut in range(1, len(INFER)):
        reader, end = _feed(INFER[:cut], INFER[cut:])
        assert end == len(INFER) and reader.target == b"/v2/models/simple/infer"
        assert dict(reader.headers) == {"Host": "127.0.0.1", "Content-Length": "5"}
    reader, end = _feed(*(INFER[i:i + 1] for i in range(len(INFER))))  # a byte at a time
    assert end == len(INFER)


def test_an_incomplete_head_waits():
    assert _feed(INFER[:-1])[1] == 0


def test_connection_close_is_read_before_llhttp_forgets_it():
    reader, _ = _feed(LIVE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert reader.keep_alive is False


def test_one_empty_line_before_the_request_line_is_skipped_but_not_a_flood():
    assert _feed(b"\r\n" + LIVE)[1] == len(LIVE) + 2
    assert _feed(b"\r\n\r\n", LIVE)[1] == len(LIVE) + 4
    assert _refusal(b"\r\n" * 64 + LIVE).status == 400


@pytest.mark.parametrize("head, reason", [
    (b"GET /v2/health/live HTTP/1.1\nHost: 127.0.0.1\n\n", "CRLF"),  # bare LF: refused, not waited on
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\n", "CR"),  # no blank line needed to refuse
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\n", "header"),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX: a\r\n folded\r\n\r\n", "whitespace"),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n", "token"),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Null: a\x00b\r\n\r\n", "value"),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nNo-Colon\r\n\r\n", "token"),
    (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
     "Content-Length"),
    (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\n", "Content-Length"),
    (b"get /v2/health/live HTTP/1.1\r\nHost: h\r\n\r\n", "method"),
    (b"GET /v2/health/live HTTP/1.2\r\nHost: h\r\n\r\n", "version"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "PRI"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "method"),  # a TLS ClientHello
])
def test_a_malformed_head_is_refused_with_400_that_says_how_to_fix_it(head, reason):
    refusal = _refusal(head)
    assert refusal.status == 400 and reason.lower() in refusal.message.lower(), refusal.message
    assert "CRLF" in refusal.message


def test_transfer_encoding_overrides_content_length_and_the_connection_then_closes():
    """RFC 9112 6.3 (Python's requests sends both when told to chunk a body it holds whole)."""
    head = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 13\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    reader = HeadReader()
    assert reader.feed(bytearray(head)) == len(head)
    assert reader.chunked_with_length
    assert reader.normalised(head) == (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\n"
                                       b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    plain = HeadReader()
    plain.feed(bytearray(LIVE))
    assert not plain.chunked_with_length


def test_an_http_1_1_request_needs_exactly_one_host():
    missing = _refusal(LIVE.replace(b"Host: 127.0.0.1\r\n", b""))
    assert missing.status == 400 and "Host" in missing.message and "send" in missing.message
    twice = _refusal(LIVE.replace(b"\r\n\r\n", b"\r\nhost: evil.example\r\n\r\n"))
    assert twice.status == 400 and "one Host" in twice.message
    assert _feed(b"GET /v2/health/live HTTP/1.0\r\n\r\n")[1]  # HTTP/1.0 needs none (aiohttp's request)


def test_a_long_field_line_gets_431_whether_complete_or_still_coming():
    line = b"X-Big: " + b"a" * LANE_LINE_BYTES + b"\r\n"
    complete = _refusal(LIVE.replace(b"\r\n\r\n", b"\r\n" + line + b"\r\n"))
    coming = _refusal(LIVE[:-2] + line[:-2])  # no line end yet: refused as soon as it is too long
    for refusal in (complete, coming):
        assert refusal.status == 431 and str(LANE_LINE_BYTES) in refusal.message, refusal.message
    assert _feed(LIVE.replace(b"\r\n\r\n", b"\r\nX-Ok: " + b"a" * (LANE_LINE_BYTES - 8) + b"\r\n\r\n"))[1]


def test_a_long_target_gets_414():
    refusal = _refusal(b"GET /" + b"a" * LANE_LINE_BYTES)
    assert refusal.status == 414 and "target" in refusal.message


def test_the_whole_head_and_its_field_count_are_bounded():
    fields = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 4000) for i in range(LANE_HEAD_BYTES // 4000 + 1))
    big = _refusal(LIVE[:-2] + fields)
    assert big.status == 431 and str(LANE_HEAD_BYTES) in big.message
    many = _refusal(LIVE[:-2] + b"".join(b"X-%d: 1\r\n" % i for i in range(LANE_MAX_FIELDS + 1)) + b"\r\n")
    assert many.status == 431 and str(LANE_MAX_FIELDS) in many.message


_FIELD = st.tuples(st.from_regex(r"X-[A-Za-z0-9-]{1,12}", fullmatch=True),
                   st.from_regex(r"[ -~]{0,20}", fullmatch=True).map(str.strip))


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(_FIELD, max_size=6), length=st.integers(0, 10**9), at=st.integers(0, 6),
       spelling=st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]))
def test_a_chunked_head_with_a_length_always_normalises_to_a_chunked_head_that_closes(fields, length, at, spelling):
    """Whatever other fields come and wherever the Content-Length sits (any case), the head handed to aiohttp
    has no Content-Length left, is still one valid chunked request, and closes the connection."""
    lines = [b"%s: %s" % (name.encode(), value.encode()) for name, value in fields]
    lines.insert(min(at, len(lines)), b"%s: %d" % (spelling, length))
    head = b"\r\n".join([b"POST /v2/models/m/infer HTTP/1.1", b"Host: h", *lines,
                           b"Transfer-Encoding: chunked"]) + b"\r\n\r\n"
    reader = HeadReader()
    assert reader.feed(bytearray(head)) == len(head) and reader.chunked_with_length
    normalised = reader.normalised(head)
    again = HeadReader()
    assert again.feed(bytearray(normalised)) == len(normalised)
    assert not again.chunked_with_length and "Content-Length" not in again.headers
    assert again.headers.get("Transfer-Encoding") == "chunked" and not again.keep_alive
    assert [(k, v) for k, v in again.headers.items() if k.startswith("X-")] == \
        [(name, value) for name, value in fields]
