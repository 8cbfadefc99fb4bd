"""The W3C ``traceparent`` a client sends (an HTTP header, gRPC metadata), as the OpenTelemetry exporter
reads it (with OpenTelemetry's ``TraceContextTextMapPropagator``): any text is a caller's span context or
nothing, never an error nor a log line; what is read is what was sent."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import SpanContext, get_current_span

from appliance.protocol.trace_otel import caller_context

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
_HEX = "0123456789abcdef"
VALID = st.builds(lambda version, trace, span, flags: f"{version}-{trace}-{span}-{flags}",
                  st.text(_HEX, min_size=2, max_size=2), st.text(_HEX, min_size=32, max_size=32),
                  st.text(_HEX, min_size=16, max_size=16), st.text(_HEX, min_size=2, max_size=2))


def _span(value: str | None) -> SpanContext | None:
    context = caller_context(value)
    return get_current_span(context).get_span_context() if context is not None else None


@FUZZ
@given(st.text(max_size=80) | VALID | VALID.flatmap(lambda value: st.builds(
    lambda at, piece: value[:at] + piece + value[at + 1:], st.integers(0, len(value)), st.text(max_size=3))))
def test_any_traceparent_is_a_span_context_or_none(value):
    context = _span(value)
    if context is None:
        return
    fields = value.strip(" \t").split("-")
    version, trace, span, flags = fields[:4]
    assert set(version + trace + span + flags) <= set(_HEX) and len(trace) == 32 and len(span) == 16
    assert version != "ff" and (version != "00" or len(fields) == 4)  # version 00 has exactly four fields
    assert context.trace_id == int(trace, 16) != 0 and context.span_id == int(span, 16) != 0
    assert int(context.trace_flags) == int(flags, 16) and context.is_remote


def test_the_w3c_rules():
    assert _span("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01") is not None
    assert _span(None) is None and _span("") is None
    assert _span("ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01") is None  # invalid version
    assert _span("00-" + "0" * 32 + "-b7ad6b7169242424-01") is None  # all-zero trace id
    assert _span("00-0af7651916cd43dd8448eb211c12666c-" + "0" * 16 + "-01") is None
    assert _span("00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-extra") is None
    assert _span("00-0AF7651916CD43DD8448EB211C12666C-B7AD6B7169242424-01") is None  # hex is lowercase
    assert _span("01-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-later") is not None  # a newer version


def test_an_oversized_traceparent_is_ignored_without_a_log_line(caplog: pytest.LogCaptureFixture):
    """The propagator logs a warning for a traceparent over 512 characters: a client must not be able to
    write one line to the daemon's log per request."""
    with caplog.at_level(logging.DEBUG):
        assert _span("01-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-" + "x" * 600) is None
    assert caplog.records == []
