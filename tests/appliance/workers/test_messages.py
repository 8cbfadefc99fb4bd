"""Lane heads as they travel from a worker to the daemon: rebuilt as sent, refused when malformed."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from appliance.protocol.operations import Operation
from appliance.rest.lane_wire import LaneHead
from appliance.workers.messages import head_fields, lane_head


def test_a_head_travels_whole():
    headers = CIMultiDict([("Host", "box"), ("X-Twice", "a"), ("x-twice", "b"), ("Content-Length", "12")])
    head = LaneHead(Operation.INFER, "POST", "/v2/models/m/versions/2/infer", "m", "2", headers, 12, True)
    back = lane_head(head_fields(head))
    assert (back.operation, back.method, back.target, back.model, back.version, back.length, back.close) == \
        (Operation.INFER, "POST", "/v2/models/m/versions/2/infer", "m", "2", 12, True)
    assert back.headers.getall("x-twice") == ["a", "b"] and back.headers["HOST"] == "box"


@pytest.mark.parametrize("fields", [
    ("model_load", "POST", "/v2/repository/models/m/load", "m", None, [], 0, False),  # a control operation
    ("no such operation", "GET", "/", "", None, [], 0, False),
    ("infer", b"POST", "/v2/models/m/infer", "m", None, [], 0, False),
    ("infer", "POST", "/v2/models/m/infer", "m", 7, [], 0, False),
    ("infer", "POST", "/v2/models/m/infer", "m", None, [], "12", False),
    ("infer", "POST", "/v2/models/m/infer", "m", None, [], 0),
])
def test_fields_that_describe_no_lane_request_are_refused(fields):
    with pytest.raises((ValueError, TypeError)):
        lane_head(fields)


def test_a_head_travels_as_plain_values_only():
    import pickle

    from appliance.workers.link import plain_values

    head = LaneHead(Operation.INFER, "POST", "/v2/models/m/infer", "m", None, CIMultiDict([("Host", "box")]), 0, False)
    fields = plain_values(pickle.dumps(head_fields(head)))  # what the daemon's end of a link accepts
    assert lane_head(fields).headers["host"] == "box"


def test_header_fields_that_are_not_pairs_of_strings_are_refused():
    with pytest.raises(ValueError):
        lane_head(("infer", "POST", "/v2/models/m/infer", "m", None, [("Host", 1)], 0, False))
