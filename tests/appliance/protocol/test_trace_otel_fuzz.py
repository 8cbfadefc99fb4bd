"""The W3C ``traceparent`` a client sends (an HTTP header, gRPC metadata), as the OpenTelemetry exporter
reads it: any text is a caller's span context or nothing, never an error; what is read is what was sent."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol.trace_otel import parse_traceparent

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
_HEX = "0123456789abcdef"
VALID = st.builds(lambda version, trace, span, flags: f"{version}-{trace}-{span}-{flags}",
                  st.text(_HEX, min_size=2, max_size=2), st.text(_HEX, min_size=32, max_size=32),
                  st.text(_HEX, min_size=16, max_size=16), st.text(_HEX, min_size=2, max_size=2))


@FUZZ
@given(st.text(max_size=80) | VALID | VALID.flatmap(lambda value: st.builds(
    lambda at, piece: value[:at] + piece + value[at + 1:], st.integers(0, len(value)), st.text(max_size=3))))
def test_any_traceparent_is_a_span_context_or_none(value):
    context = parse_traceparent(value)
    if context is None:
        return
    version, trace, span, flags = value.strip().lower().split("-")
    assert version != "ff" and context.trace_id == int(trace, 16) != 0 and context.span_id == int(span, 16) != 0
    assert int(context.trace_flags) == int(flags, 16) and context.is_remote


def test_the_w3c_rules():
    assert parse_traceparent("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01") is not None
    assert parse_traceparent(None) is None and parse_traceparent("") is None
    assert parse_traceparent("ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01") is None  # invalid version
    assert parse_traceparent("00-" + "0" * 32 + "-b7ad6b7169242424-01") is None  # all-zero trace id
    assert parse_traceparent("00-0af7651916cd43dd8448eb211c12666c-" + "0" * 16 + "-01") is None
    assert parse_traceparent("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-extra") is None
