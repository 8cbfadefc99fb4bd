"""Traces as OpenTelemetry spans (``trace_mode = opentelemetry``), exported over OTLP/HTTP.

A finished ``Trace`` becomes Triton's three spans: ``InferRequest`` (the front end's receive and send
events and INFER_RESPONSE_COMPLETE), a span named after the model (REQUEST_START, QUEUE_START,
REQUEST_END; attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
``triton.trace_parent_id``) as its child, and ``compute`` (COMPUTE_START to COMPUTE_END) as the model
span's child, when the model ran (a response-cache hit has none). A request that carried a W3C
``traceparent`` (an HTTP header, gRPC metadata) is a child of the caller's span, in the caller's trace.

Nothing of it runs on the request's path: ``export`` queues the trace (never blocks; a full queue drops it,
counted); a thread of its own builds the spans, which the SDK's batch span processor sends on its own
thread, ``schedule_delay`` apart. Timestamps are recorded on the monotonic clock, and exported on the wall
clock (OpenTelemetry's), shifted by the difference measured at start.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
from opentelemetry.trace import Tracer as OtelTracer

from appliance.engine.trace import Trace

__all__ = ["OtelExporter", "parse_traceparent"]

log = logging.getLogger(__name__)

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_STOP = object()
_QUEUE = 10_000
"""Finished traces waiting for the span thread at most; more are dropped (and counted)."""
_ROOT_EVENTS = ("HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START", "GRPC_SEND_END")
_MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The caller's span from a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``); None when absent
    or not one (version ff, all-zero ids), as the W3C spec says to ignore it then."""
    if not value:
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match.group(4), 16)))


_CLOSE_FLUSH_S = 2.0
"""How long closing waits for the last batches to be sent."""


class OtelExporter:
    """Exports finished traces as spans; see the module's docstring. ``close`` flushes and stops."""

    @staticmethod
    def continues(traceparent: str) -> bool:
        """Whether a request's W3C ``traceparent`` names a span its trace continues (else it is ignored)."""
        return parse_traceparent(traceparent) is not None

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
        self._queue: queue.Queue[object] = queue.Queue(_QUEUE)
        self._thread: threading.Thread | None = None
        self.url = url
        self.dropped = 0
        """Traces dropped because the span thread was that far behind."""

    def export(self, trace: Trace) -> None:
        """Queue one finished trace (never blocks); the span thread starts on the first one."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel-spans", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(trace)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("OpenTelemetry: traces come faster than spans are built; dropping them (raise "
                            "trace_rate to trace fewer requests)")

    def close(self) -> None:
        """Build the queued spans, export what is batched and stop (blocks: call off the event loop)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        # One bounded try at what is batched (the SDK's force_flush takes no timeout: it runs on a thread of
        # its own), then the exporter stops retrying: a receiver that is down (each export retries for up to
        # 10 s) must not hold the daemon's stop.
        flushing = threading.Thread(target=self._provider.force_flush, name="otel-flush", daemon=True)
        flushing.start()
        flushing.join(_CLOSE_FLUSH_S)
        self._exporter.shutdown()
        self._provider.shutdown()

    def flush(self) -> None:
        """Wait until the queued traces are built and exported (blocks)."""
        if self._thread is not None:
            self._queue.join()
        self._provider.force_flush()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, Trace)
                self._spans(item)
            except Exception:  # a trace that cannot be built is lost, not the thread
                log.exception("OpenTelemetry: could not build the spans of a trace")
            finally:
                self._queue.task_done()

    def _spans(self, trace: Trace) -> None:
        marks = dict(trace.timestamps)  # a name marked twice keeps its last time
        if "REQUEST_END" in marks:
            marks.setdefault("INFER_RESPONSE_COMPLETE", marks["REQUEST_END"])
        wall = {name: ns + self._offset for name, ns in marks.items()}
        start, end = min(wall.values()), max(wall.values())
        parent = parse_traceparent(trace.parent)
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        root = self._tracer.start_span("InferRequest", context=context, start_time=start)
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
