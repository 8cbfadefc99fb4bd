"""Triton's trace extension: which requests are traced, and what a trace records.

A ``Trace`` travels with its request (``InferRequest.trace``) from the front end through the scheduler
and collects Triton's timestamp names with ``time.monotonic_ns()`` values: REQUEST_START (the front end
got the request), QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END (from
the batch's measured timing) and REQUEST_END (the response is ready). The ``Tracer`` samples requests
by the settings in force for their model (the model's own scope, else the global one: one request in
``trace_rate`` counted in that scope, as Triton counts) and hands finished traces to a ``TraceWriter``
with the scope's file rules.
"""

from __future__ import annotations

import itertools

from appliance.engine.trace import Trace
from appliance.protocol.trace_settings import TraceScope, TraceSettings
from appliance.protocol.trace_writer import TraceWriter

__all__ = ["Trace", "Tracer"]


class Tracer:
    """Samples requests: per scope, one request in ``trace_rate`` while ``trace_count`` allows, when the
    scope's ``trace_level`` includes TIMESTAMPS. Used from the event loop only."""

    def __init__(self, settings: TraceSettings, writer: TraceWriter) -> None:
        self.settings = settings
        self.writer = writer
        self._ids = itertools.count(1)

    def start(self, model_name: str, model_version: int, received_ns: int | None = None) -> Trace | None:
        """A new trace for this request, or None when it is not sampled; ``received_ns``: when the front
        end got the request (``time.monotonic_ns()``), now when not given."""
        scope = self.settings.scope(model_name)
        if not scope.sample():
            return None
        trace = Trace(next(self._ids), model_name, model_version, sink=scope)
        trace.mark("REQUEST_START", received_ns)
        return trace

    def finish(self, trace: Trace) -> None:
        """The request answered (or failed): mark REQUEST_END and hand the trace to the writer."""
        trace.mark("REQUEST_END")
        scope = trace.sink
        assert isinstance(scope, TraceScope)
        last = scope.collect()
        self.writer.add(trace.to_json(), scope.values.log_frequency, stream=scope.id, counted=scope.limited,
                        last=last)
