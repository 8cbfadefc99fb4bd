"""What the infer lane takes (``parse_head``), and what it leaves to aiohttp."""

from __future__ import annotations

import pytest

from appliance.rest.lane_wire import LANE_BODY_BYTES, parse_head

GOOD = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
        b"Content-Length: 17")


def test_a_lane_request_is_parsed():
    head = parse_head(GOOD, LANE_BODY_BYTES)
    assert head is not None
    assert (head.target, head.model, head.version, head.length, head.close) == (
        "/v2/models/simple/infer", "simple", None, 17, False)
    assert head.headers["Content-Type"] == "application/json" and head.headers["host"] == "127.0.0.1:8000"


def test_versions_close_and_field_spacing():
    head = parse_head(b"POST /v2/models/m.v2_x-1/versions/3/infer HTTP/1.1\r\nContent-Length:0\r\n"
                      b"Connection:  keep-alive, Close \t\r\nX-Forwarded-For: 1.2.3.4\r\nx-forwarded-for: 5.6.7.8",
                      LANE_BODY_BYTES)
    assert head is not None
    assert (head.model, head.version, head.length, head.close) == ("m.v2_x-1", "3", 0, True)
    assert head.headers.getall("X-Forwarded-For") == ["1.2.3.4", "5.6.7.8"]


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
    head = parse_head(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1" % target, LANE_BODY_BYTES)
    assert head is not None
    assert (head.operation.name, head.method, head.model, head.version, head.length) == (
        operation, "GET", model, version, 0)
    assert parse_head(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 0", 1).operation.name == "INFER"


@pytest.mark.parametrize("head", [
    GOOD.replace(b"POST", b"GET"),
    GOOD.replace(b"POST", b"PUT"),
    b"GET /v2/health/live HTTP/1.1\r\nContent-Length: 1",
    b"GET /v2/health/live HTTP/1.1\r\nTransfer-Encoding: chunked",
    b"HEAD /v2/health/live HTTP/1.1",
    b"GET /v2/models/stats HTTP/1.1",
    b"GET /v2/models/m/stats HTTP/1.1",
    b"GET /v2/health HTTP/1.1",
    b"GET /v2/models/m/ready?x=1 HTTP/1.1",
    b"POST /v2/models/m/ready HTTP/1.1\r\nContent-Length: 0",
    GOOD.replace(b"HTTP/1.1", b"HTTP/1.0"),
    GOOD.replace(b"/infer", b"/infer?x=1"),
    GOOD.replace(b"/infer", b"/generate"),
    GOOD.replace(b"simple", b"sim%70le"),
    GOOD.replace(b"simple", b".."),
    GOOD.replace(b"simple", b"a/b"),
    GOOD.replace(b"/simple/", b"/simple/versions/x/"),
    GOOD.replace(b"POST ", b"POST  "),
    GOOD + b"\r\nTransfer-Encoding: chunked",
    GOOD + b"\r\nContent-Length: 17",
    GOOD.replace(b"Content-Length: 17", b"Content-Length: +17"),
    GOOD.replace(b"Content-Length: 17", b"Content-Length: 1_7"),
    GOOD.replace(b"Content-Length: 17", b"X-Other: 17"),
    GOOD.replace(b"17", str(LANE_BODY_BYTES + 1).encode()),
    GOOD + b"\r\nContent-Encoding: gzip",
    GOOD + b"\r\nAccept-Encoding: gzip, br",
    GOOD + b"\r\nExpect: 100-continue",
    GOOD + b"\r\nUpgrade: websocket\r\nConnection: Upgrade",
    GOOD + b"\r\n folded continuation",
    GOOD + b"\r\nBad Name: x",
    GOOD + b"\r\nX-Null: a\x00b",
    GOOD + b"\r\nX-Bare-LF: a\nb",
    GOOD + b"\r\nNo-Colon",
    GOOD + b"\r\nHost: evil.example",
])
def test_anything_else_is_aiohttps(head):
    assert parse_head(head, LANE_BODY_BYTES) is None


def test_the_body_bound_is_the_smaller_of_the_lanes_and_max_request_bytes():
    assert parse_head(GOOD, 16) is None
    assert parse_head(GOOD, 17) is not None


def test_identity_coding_and_plain_accept_encoding_stay_on_the_lane():
    assert parse_head(GOOD + b"\r\nContent-Encoding: identity\r\nAccept-Encoding: identity", LANE_BODY_BYTES)
