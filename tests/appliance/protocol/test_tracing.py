"""The tracer's sampling: trace_level, trace_rate, trace_count, per-model settings over the global ones, and
the cap on traces a client's traceparent forces (trace_client_rate)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import get_current_span

from appliance.protocol.trace_otel import OtelExporter
from appliance.protocol.trace_settings import TraceSettings
from appliance.protocol.trace_writer import TraceWriter
from appliance.protocol.tracing import Tracer


def _tracer() -> tuple[Tracer, TraceSettings, TraceWriter]:
    settings = TraceSettings()
    writer = TraceWriter(None)  # in memory: what was finished is readable at once after flush
    return Tracer(settings, writer), settings, writer


def _sampled(tracer: Tracer, model: str, requests: int) -> list[int]:
    """Which of ``requests`` requests to ``model`` were traced (their indexes)."""
    traced = []
    for index in range(requests):
        trace = tracer.start(model, 1)
        if trace is not None:
            tracer.finish(trace)
            traced.append(index)
    return traced


def test_nothing_is_traced_while_the_level_is_off():
    tracer, settings, _ = _tracer()
    settings.update({"trace_rate": ["1"]})
    assert _sampled(tracer, "m", 10) == []


def test_one_request_in_trace_rate_is_traced():
    tracer, settings, writer = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["3"]})
    assert _sampled(tracer, "m", 10) == [2, 5, 8]  # as Triton: the rate-th request, the 2*rate-th...
    writer.close()
    kept = writer.kept()
    assert [t["id"] for t in kept] == [1, 2, 3]
    assert kept[0]["model_name"] == "m" and kept[0]["model_version"] == 1
    assert [s["name"] for s in kept[0]["timestamps"]] == ["REQUEST_START", "REQUEST_END"]
    assert kept[0]["timestamps"][0]["ns"] <= kept[0]["timestamps"][1]["ns"]


def test_trace_count_is_counted_down_and_stops_tracing():
    tracer, settings, _ = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["2"]})
    assert _sampled(tracer, "m", 5) == [0, 1]
    assert settings.get()["trace_count"] == ["0"]
    settings.update({"trace_count": ["-1"]})
    assert len(_sampled(tracer, "m", 5)) == 5
    assert settings.get()["trace_count"] == ["-1"]  # no limit is not counted down


def test_a_models_own_settings_override_the_global_ones():
    tracer, settings, _ = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]}, model="traced")
    settings.update({"trace_count": ["1"]}, model="traced")
    assert _sampled(tracer, "other", 3) == []  # the global level is still OFF
    assert _sampled(tracer, "traced", 3) == [0]  # its own count ran out
    assert settings.get("traced")["trace_count"] == ["0"] and settings.get()["trace_count"] == ["-1"]
    settings.update({"trace_count": []}, model="traced")  # cleared: the global count (no limit) again
    assert _sampled(tracer, "traced", 3) == [0, 1, 2]


def test_the_rate_is_counted_per_settings_scope_as_triton_counts_it():
    # Triton counts requests in the settings object they are sampled by: every model that follows the
    # global settings shares one count; a model with settings of its own counts its own requests.
    tracer, settings, _ = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["2"]})
    picks = [tracer.start(model, 1) is not None for model in ("a", "b", "a", "b", "a")]
    assert picks == [False, True, False, True, False]
    settings.update({"log_frequency": ["5"]}, model="a")  # a scope of its own: counted from 0
    picks = [tracer.start(model, 1) is not None for model in ("a", "b", "a", "b", "a")]
    assert picks == [False, True, True, False, False]  # b: the global count goes on (6th, 7th)


def test_an_update_starts_the_count_afresh():
    tracer, settings, _ = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["3"]})
    assert _sampled(tracer, "m", 2) == []
    settings.update({"trace_rate": ["3"]})  # a new settings object, as Triton replaces it
    assert _sampled(tracer, "m", 3) == [2]


def test_a_models_count_is_its_own_once_it_has_settings():
    tracer, settings, _ = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["3"]})
    settings.update({"log_frequency": ["2"]}, model="m")  # takes a copy of the global count
    assert _sampled(tracer, "m", 5) == [0, 1, 2]
    assert settings.get("m")["trace_count"] == ["0"] and settings.get()["trace_count"] == ["3"]
    assert _sampled(tracer, "other", 5) == [0, 1, 2]
    assert settings.get()["trace_count"] == ["0"]


def test_traces_go_to_the_writer_with_their_scopes_file_rules():
    calls = []

    class Writer:
        def add(self, trace, log_frequency=0, **route):
            calls.append((trace["model_name"], log_frequency, route))

    settings = TraceSettings()
    tracer = Tracer(settings, Writer())  # type: ignore[arg-type]
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
    settings.update({"trace_count": ["2"], "log_frequency": ["7"]}, model="m")
    for model in ("g", "m", "m"):
        tracer.finish(tracer.start(model, 1))
    (g, m1, m2) = calls
    global_scope, model_scope = settings.scope("g").id, settings.scope("m").id
    assert g == ("g", 0, {"stream": global_scope, "counted": False, "last": False})
    assert m1 == ("m", 7, {"stream": model_scope, "counted": True, "last": False})
    assert m2 == ("m", 7, {"stream": model_scope, "counted": True, "last": True})  # its count ran out


def test_a_front_ends_marks_surround_the_cores_as_triton_names_them():
    tracer, settings, writer = _tracer()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
    for frontend, receive, send in (
            ("HTTP", ("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END")),
            ("GRPC", ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"), ("GRPC_SEND_START", "GRPC_SEND_END"))):
        trace = tracer.start("m", 1, 100, frontend=frontend, read_ns=200)
        Tracer.end(trace)
        tracer.finish(trace, (frontend, 300, 400))
        writer.flush()
        marks = [(s["name"], s["ns"]) for s in writer.kept()[-1]["timestamps"]]
        assert marks[:3] == [(receive[0], 100), (receive[1], 200), ("REQUEST_START", 200)]
        assert [name for name, _ in marks[3:]] == ["REQUEST_END", *send]
        assert marks[-2:] == [(send[0], 300), (send[1], 400)]
    writer.close()


TRACEPARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


@pytest.fixture
def exporter() -> Iterator[OtelExporter]:
    spans = OtelExporter("http://127.0.0.1:9/v1/traces")  # nothing is exported in these tests
    yield spans
    spans.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _forced(tracer: Tracer, requests: int, traceparent: str = TRACEPARENT) -> list[int]:
    """Which of ``requests`` requests carrying ``traceparent`` were traced (their indexes)."""
    return [index for index in range(requests)
            if tracer.start("m", 1, traceparent=lambda: traceparent) is not None]


def test_a_clients_traceparent_forces_traces_only_within_trace_client_rate(exporter):
    settings, clock = TraceSettings(), _Clock()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1000"]})
    tracer = Tracer(settings, TraceWriter(None), exporter, client_rate=3, clock=clock)
    assert _forced(tracer, 10) == [0, 1, 2]  # a second's worth at once, then the cap
    clock.now += 0.5
    assert _forced(tracer, 5) == [0]  # half a second: one and a half traces
    clock.now += 60
    assert _forced(tracer, 10) == [0, 1, 2]  # an idle minute saves no more than a second's worth
    assert _forced(tracer, 5, "not-a-trace-context") == []  # not a traceparent: sampled by trace_rate


def test_over_the_cap_a_request_is_sampled_by_the_rate_and_continues_the_callers_trace(exporter):
    settings = TraceSettings()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["2"]})
    tracer = Tracer(settings, TraceWriter(None), exporter, client_rate=0)  # 0: never forced
    traces = [tracer.start("m", 1, traceparent=lambda: TRACEPARENT) for _ in range(4)]
    assert [trace is not None for trace in traces] == [False, True, False, True]
    caller = get_current_span(traces[1].parent).get_span_context()
    assert (f"{caller.trace_id:032x}", f"{caller.span_id:016x}") == tuple(TRACEPARENT.split("-")[1:3])


def test_a_traceparent_forces_nothing_while_the_level_is_off(exporter):
    tracer = Tracer(TraceSettings(), TraceWriter(None), exporter, client_rate=100)
    assert _forced(tracer, 5) == []
