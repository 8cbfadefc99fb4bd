"""What the infer lane takes (``lane_request`` over a head ``HeadReader`` read), what it leaves to aiohttp,
and how it writes an answer after which it closes."""

from __future__ import annotations

import pytest

from appliance.rest.lane_head import HeadReader
from appliance.rest.lane_wire import LANE_BODY_BYTES, LaneHead, closing, error_response, lane_request

GOOD = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
        b"Content-Length: 17")


def _take(head: bytes, max_body: int = LANE_BODY_BYTES) -> LaneHead | None:
    """``head`` (without its blank line) read whole, then judged."""
    reader = HeadReader()
    data = bytearray(head + b"\r\n\r\n")
    assert reader.feed(data) == len(data)
    return lane_request(reader, max_body)


def test_a_lane_request_is_parsed():
    head = _take(GOOD)
    assert head is not None
    assert (head.target, head.model, head.version, head.length, head.close) == (
        "/v2/models/simple/infer", "simple", None, 17, False)
    assert head.headers["Content-Type"] == "application/json" and head.headers["host"] == "127.0.0.1:8000"


def test_versions_close_and_field_spacing():
    head = _take(b"POST /v2/models/m.v2_x-1/versions/3/infer HTTP/1.1\r\nHost: h\r\nContent-Length:0\r\n"
                 b"Connection:  keep-alive, Close \t\r\nX-Forwarded-For: 1.2.3.4\r\nx-forwarded-for: 5.6.7.8")
    assert head is not None
    assert (head.model, head.version, head.length, head.close) == ("m.v2_x-1", "3", 0, True)
    assert head.headers.getall("X-Forwarded-For") == ["1.2.3.4", "5.6.7.8"]
    assert head.headers["Connection"] == "keep-alive, Close"  # no trailing whitespace kept


@pytest.mark.parametrize("target, operation, model, version", [
    (b"/v2/health/live", "SERVER_LIVE", "", None),
    (b"/v2/health/ready", "SERVER_READY", "", None),
    (b"/v2/models/m", "MODEL_METADATA", "m", None),
    (b"/v2/models/m/versions/2", "MODEL_METADATA", "m", "2"),
    (b"/v2/models/m/ready", "MODEL_READY", "m", None),
    (b"/v2/models/m/versions/2/config", "MODEL_CONFIG", "m", "2"),
    (b"/v2/models/stats/ready", "MODEL_READY", "stats", None),
])
def test_the_reads_between_inferences_are_lane_requests(target, operation, model, version):
    head = _take(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1" % target)
    assert head is not None
    assert (head.operation.name, head.method, head.model, head.version, head.length) == (
        operation, "GET", model, version, 0)
    infer = _take(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 0", 1)
    assert infer is not None and infer.operation.name == "INFER"


@pytest.mark.parametrize("head", [
    GOOD.replace(b"POST", b"GET"),
    GOOD.replace(b"POST", b"PUT"),
    b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\nContent-Length: 1",
    b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked",
    b"HEAD /v2/health/live HTTP/1.1\r\nHost: h",
    b"GET /v2/models/stats HTTP/1.1\r\nHost: h",
    b"GET /v2/models/m/stats HTTP/1.1\r\nHost: h",
    b"GET /v2/health HTTP/1.1\r\nHost: h",
    b"GET /v2/models/m/ready?x=1 HTTP/1.1\r\nHost: h",
    b"POST /v2/models/m/ready HTTP/1.1\r\nHost: h\r\nContent-Length: 0",
    GOOD.replace(b"HTTP/1.1", b"HTTP/1.0"),
    GOOD.replace(b"HTTP/1.1", b"HTTP/1.0").replace(b"Host: 127.0.0.1:8000\r\n", b""),  # 1.0 needs no Host
    GOOD.replace(b"/infer", b"/infer?x=1"),
    GOOD.replace(b"/infer", b"/generate"),
    GOOD.replace(b"simple", b"sim%70le"),
    GOOD.replace(b"simple", b".."),
    GOOD.replace(b"simple", b"a/b"),
    GOOD.replace(b"/simple/", b"/simple/versions/x/"),
    GOOD.replace(b"Content-Length: 17", b"X-Other: 17"),
    GOOD.replace(b"17", str(LANE_BODY_BYTES + 1).encode()),
    GOOD + b"\r\nContent-Encoding: gzip",
    GOOD + b"\r\nAccept-Encoding: gzip, br",
    GOOD + b"\r\nAccept-Encoding: identity\r\nAccept-Encoding: deflate",
    GOOD + b"\r\nExpect: 100-continue",
    GOOD + b"\r\nUpgrade: websocket\r\nConnection: Upgrade",
    GOOD + b"\r\nConnection: upgrade",
    GOOD.replace(b"POST /v2/models/simple/infer", b"POST http://127.0.0.1:8000/v2/models/simple/infer"),
])
def test_anything_else_is_aiohttps(head):
    assert _take(head) is None


def test_the_body_bound_is_the_smaller_of_the_lanes_and_max_request_bytes():
    assert _take(GOOD, 16) is None
    assert _take(GOOD, 17) is not None


def test_identity_coding_and_plain_accept_encoding_stay_on_the_lane():
    assert _take(GOOD + b"\r\nContent-Encoding: identity\r\nAccept-Encoding: identity")


def test_closing_adds_connection_close_after_the_status_line():
    reply = closing(error_response(400, "bad", b"X-Extra: 1\r\n"))
    head, _, body = reply[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 400 Bad Request" and lines[1] == b"Connection: close"
    assert b"X-Extra: 1" in lines and body == b'{"error":"bad"}'
    large = closing([b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", b"abc"])
    assert large == [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\n", b"abc"]
