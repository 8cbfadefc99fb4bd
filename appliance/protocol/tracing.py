"""Triton's trace extension: which requests are traced, and what a trace records.

A ``Trace`` travels with its request (``InferRequest.trace``) from the front end through the scheduler
and collects Triton's timestamp names with ``time.monotonic_ns()`` values: the front end's
(``HTTP_RECV_START``/``HTTP_RECV_END`` or ``GRPC_WAITREAD_START``/``GRPC_WAITREAD_END`` around reading the
request, ``..._SEND_START``/``..._SEND_END`` around answering it), REQUEST_START (the request is decoded),
QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END (from the batch's
measured timing) and REQUEST_END (the response is ready) — the names NVIDIA's trace_summary.py reads.
The ``Tracer`` samples requests by the settings in force for their model (the model's own scope, else
the global one: one request in ``trace_rate`` counted in that scope, as Triton counts) and hands
finished traces to a ``TraceWriter`` with the scope's file rules, or, in OpenTelemetry mode, to an
``OtelExporter`` (appliance.protocol.trace_otel): there a request that carries a W3C ``traceparent`` is
traced whatever the rate and count (as Triton), as a child of the caller's span, up to
``trace_client_rate`` such requests a second over the daemon. A trace costs the daemon about as much CPU
as the request it traces, so a client sending a traceparent with every request would otherwise double the
daemon's work at will; beyond the cap a request is sampled by ``trace_rate`` like any other (and, when
sampled, is still the caller's span's child).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from appliance.engine.trace import Trace
from appliance.protocol.trace_settings import TraceScope, TraceSettings
from appliance.protocol.trace_writer import TraceWriter

if TYPE_CHECKING:  # imported where spans are exported: the OpenTelemetry SDK loads only then
    from appliance.protocol.trace_otel import OtelExporter

__all__ = ["Trace", "Tracer"]


class Tracer:
    """Samples requests: per scope, one request in ``trace_rate`` while ``trace_count`` allows, when the
    scope's ``trace_level`` includes TIMESTAMPS. Used from the event loop only."""

    def __init__(self, settings: TraceSettings, writer: TraceWriter, exporter: OtelExporter | None = None, *,
                 client_rate: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.writer = writer
        self.exporter = exporter
        """OpenTelemetry mode: finished traces go here as spans instead of to the trace files."""
        self._client_traces = _TokenBucket(client_rate, clock)
        """Requests a client's traceparent may still have traced whatever the rate (trace_client_rate)."""
        self._ids = itertools.count(1)

    def start(self, model_name: str, model_version: int, received_ns: int | None = None, *,
              frontend: str | None = None, read_ns: int | None = None,
              traceparent: Callable[[], str | None] | None = None) -> Trace | None:
        """A new trace for this request, or None when it is not sampled. ``received_ns``: when the front
        end got the request; ``read_ns``: when it had read it (``time.monotonic_ns()``); ``frontend``:
        "HTTP" or "GRPC", whose receive marks the trace then carries; ``traceparent``: the request's W3C
        trace context, read only in OpenTelemetry mode."""
        scope = self.settings.scope(model_name)
        if "TIMESTAMPS" not in scope.values.level:  # tracing is off for it (the common case): nothing to count
            return None
        parent = None
        if self.exporter is not None and traceparent is not None:
            header = traceparent()
            parent = self.exporter.caller(header) if header is not None else None
        if parent is not None and self._client_traces.take():
            pass  # the caller traces this request: traced whatever the rate and count, within the cap
        elif not scope.sample():
            return None
        trace = Trace(next(self._ids), model_name, model_version, sink=scope, parent=parent)
        if frontend is not None and received_ns is not None:
            names = _RECEIVE[frontend]
            trace.mark(names[0], received_ns)
            trace.mark(names[1], read_ns)
        trace.mark("REQUEST_START", read_ns if frontend is not None else received_ns)
        return trace

    @staticmethod
    def end(trace: Trace) -> None:
        """The response is ready: mark REQUEST_END (once)."""
        if not any(name == "REQUEST_END" for name, _ in trace.timestamps):
            trace.mark("REQUEST_END")

    def finish(self, trace: Trace, sent: tuple[str, int, int] | None = None) -> None:
        """The request answered (or failed): mark REQUEST_END (unless marked), the front end's send marks
        (``sent``: its frontend and the send's start and end), and hand the trace to the writer."""
        self.end(trace)
        if sent is not None:
            frontend, start, end = sent
            trace.mark(f"{frontend}_SEND_START", start)
            trace.mark(f"{frontend}_SEND_END", end)
        if self.exporter is not None:
            self.exporter.export(trace)
            return
        scope = trace.sink
        assert isinstance(scope, TraceScope)
        last = scope.collect()
        self.writer.add(trace.to_json(), scope.values.log_frequency, stream=scope.id, counted=scope.limited,
                        last=last)


class _TokenBucket:
    """``rate`` tokens a second, holding one second's worth at most; none at all when ``rate`` is 0."""

    __slots__ = ("_rate", "_tokens", "_last", "_clock")

    def __init__(self, rate: int, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        """One token if there is one."""
        if self._rate <= 0:
            return False
        now = self._clock()
        self._tokens = min(float(self._rate), self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


_RECEIVE = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"), "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")}
"""Each front end's marks around reading a request, as Triton names them."""
