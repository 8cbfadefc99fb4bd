"""Traces as OpenTelemetry spans (``trace_mode = opentelemetry``), exported over OTLP/HTTP.

A finished ``Trace`` becomes Triton's three spans: ``InferRequest`` (the front end's receive and send
events and INFER_RESPONSE_COMPLETE), a span named after the model (REQUEST_START, QUEUE_START,
REQUEST_END; attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
``triton.trace_parent_id``) as its child, and ``compute`` (COMPUTE_START to COMPUTE_END) as the model
span's child, when the model ran (a response-cache hit has none). A request that carried a W3C
``traceparent`` (an HTTP header, gRPC metadata) is a child of the caller's span, in the caller's trace;
the header is read by OpenTelemetry's own ``TraceContextTextMapPropagator``.

``export`` builds the spans of a finished trace at once (a few objects, never blocking) and ends them into
the SDK's batch span processor, whose bounded queue and thread send them ``schedule_delay`` apart (a full
queue drops spans, as the SDK does). Timestamps are recorded on the monotonic clock, and exported on the
wall clock (OpenTelemetry's), shifted by the difference measured at start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer as OtelTracer
from opentelemetry.trace import get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from appliance.engine.trace import Trace

__all__ = ["OtelExporter", "caller_context"]

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT_MAX = 512
"""Longer values are ignored here, before the propagator, which would log a warning for each one."""
_ROOT_EVENTS = ("HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START", "GRPC_SEND_END")
_MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def caller_context(value: str | None) -> Context | None:
    """The context of the caller's span a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``) names,
    for a span to be its child; None when absent or not one (a bad format, version ff, all-zero ids: the
    W3C spec says to ignore it then)."""
    if not value or len(value) > _TRACEPARENT_MAX:
        return None
    context = _PROPAGATOR.extract({"traceparent": value})
    return context if get_current_span(context).get_span_context().is_valid else None


_CLOSE_FLUSH_S = 2.0
"""How long closing waits for the last batches to be sent."""


class OtelExporter:
    """Exports finished traces as spans; see the module's docstring. ``close`` flushes and stops."""

    caller = staticmethod(caller_context)
    """The caller's span a request's ``traceparent`` names, as ``Trace.parent`` holds it, or None."""

    def __init__(self, url: str, resource: Sequence[str] = (), *, max_queue_size: int = 2048,
                 schedule_delay_ms: int = 5000, max_export_batch_size: int = 512) -> None:
        attributes = {"service.name": "triton-inference-server"}
        attributes.update(dict(entry.split("=", 1) for entry in resource))
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._exporter = OTLPSpanExporter(endpoint=url, timeout=10)
        self._provider.add_span_processor(BatchSpanProcessor(
            self._exporter, max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_ms, max_export_batch_size=max_export_batch_size))
        self._tracer: OtelTracer = self._provider.get_tracer("edge-appliance")
        self._offset = time.time_ns() - time.monotonic_ns()
        self.url = url

    def export(self, trace: Trace) -> None:
        """Build one finished trace's spans and hand them to the batch span processor (never blocks)."""
        self._spans(trace)

    def close(self) -> None:
        """Export what is batched and stop (blocks: call off the event loop)."""
        # One bounded try at what is batched (the SDK's force_flush takes no timeout: it runs on a thread of
        # its own), then the exporter stops retrying: a receiver that is down (each export retries for up to
        # 10 s) must not hold the daemon's stop.
        flushing = threading.Thread(target=self._provider.force_flush, name="otel-flush", daemon=True)
        flushing.start()
        flushing.join(_CLOSE_FLUSH_S)
        self._exporter.shutdown()
        self._provider.shutdown()

    def flush(self) -> None:
        """Wait until the ended spans are exported (blocks)."""
        self._provider.force_flush()

    def _spans(self, trace: Trace) -> None:
        marks = dict(trace.timestamps)  # a name marked twice keeps its last time
        if "REQUEST_END" in marks:
            marks.setdefault("INFER_RESPONSE_COMPLETE", marks["REQUEST_END"])
        wall = {name: ns + self._offset for name, ns in marks.items()}
        start, end = min(wall.values()), max(wall.values())
        root = self._tracer.start_span("InferRequest", context=trace.parent, start_time=start)
        _events(root, wall, _ROOT_EVENTS)
        model = self._tracer.start_span(trace.model_name, context=set_span_in_context(root),
                                        start_time=wall.get("REQUEST_START", start))
        model.set_attributes({"triton.model_name": trace.model_name,
                              "triton.model_version": trace.model_version,
                              "triton.trace_id": trace.id, "triton.trace_parent_id": 0})
        _events(model, wall, _MODEL_EVENTS)
        if "COMPUTE_START" in wall:
            compute = self._tracer.start_span("compute", context=set_span_in_context(model),
                                              start_time=wall["COMPUTE_START"])
            _events(compute, wall, _COMPUTE_EVENTS)
            compute.end(end_time=wall.get("COMPUTE_END", wall["COMPUTE_START"]))
        model.end(end_time=wall.get("REQUEST_END", end))
        root.end(end_time=end)


def _events(span: object, wall: dict[str, int], names: Sequence[str]) -> None:
    for name in names:
        if name in wall:
            span.add_event(name, timestamp=wall[name])  # type: ignore[attr-defined]
