"""Triton's trace settings: validated as Triton validates them, global and per model, cleared by an empty
value."""

from __future__ import annotations

import pytest

from appliance.core.errors import InvalidInput, NotSupported
from appliance.protocol.trace_settings import TraceSettings, TraceValues


def test_defaults_are_tritons():
    assert TraceSettings().get() == {"trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
                                     "log_frequency": ["0"], "trace_file": [""], "trace_mode": ["triton"]}


def test_a_models_settings_override_the_global_ones_until_cleared():
    traces = TraceSettings()
    traces.update({"trace_rate": ["10"], "trace_level": ["TENSORS", "TIMESTAMPS"]})
    assert traces.get()["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    answered = traces.update({"trace_rate": ["2"], "trace_count": ["5"]}, model="m")
    assert answered["trace_rate"] == ["2"] and answered["trace_count"] == ["5"]
    assert answered["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # not set for m: the global one
    assert traces.get()["trace_rate"] == ["10"] and traces.get("other")["trace_rate"] == ["10"]
    assert traces.update({"trace_rate": []}, model="m")["trace_rate"] == ["10"]  # cleared: global again
    traces.update({"trace_level": ["OFF"]})
    assert traces.get("m")["trace_level"] == ["OFF"] and traces.get("m")["trace_count"] == ["5"]
    assert traces.update({"trace_rate": []})["trace_rate"] == ["1000"]  # a global one back to the default


@pytest.mark.parametrize("changes,error,message", [
    ({"trace_level": ["OFF", "TENSORS"]}, InvalidInput, "only one trace level 'OFF'"),
    ({"trace_level": ["VERBOSE"]}, InvalidInput, "unknown trace level 'VERBOSE'"),
    ({"trace_rate": ["ten"]}, InvalidInput, "Unable to parse 'trace_rate', got: ten"),
    ({"trace_rate": ["-1"]}, InvalidInput, "out of range"),
    ({"trace_rate": ["1", "2"]}, InvalidInput, "expect only 1 value for 'trace_rate'"),
    ({"trace_count": ["-2"]}, InvalidInput, "-1 \\(no limit\\)"),
    ({"trace_file": ["/tmp/t.json"]}, NotSupported, "can not be updated through network protocol"),
    ({"sample": ["1"]}, InvalidInput, "unknown trace setting 'sample'; the settings are trace_file"),
])
def test_bad_changes_are_refused_whole(changes, error, message):
    traces = TraceSettings()
    with pytest.raises(error, match=message):
        traces.update({"trace_rate": ["7"], **changes})
    assert traces.get()["trace_rate"] == ["1000"]  # nothing of a refused update applies


START = TraceValues(("TIMESTAMPS",), rate=1)  # --trace-config level=TIMESTAMPS --trace-config rate=1


def _shown(answer: dict[str, list[str]]) -> dict[str, object]:
    """As tritonclient's HTTP client shows them (single values unwrapped)."""
    return {k: v if k == "trace_level" else v[0] for k, v in answer.items()}


def test_start_up_values_are_in_force_and_what_clearing_returns_to():
    traces = TraceSettings(START, trace_file="global_unittest.log")
    initial = {"trace_file": "global_unittest.log", "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
               "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
    assert _shown(traces.get()) == initial and _shown(traces.get("simple")) == initial
    traces.update({"trace_rate": ["56"], "trace_count": ["78"], "trace_level": ["OFF"]})
    assert _shown(traces.update({"trace_rate": [], "trace_count": []})) == {**initial, "trace_level": ["OFF"]}


def test_a_models_settings_follow_the_global_ones_they_do_not_set():
    # L0_trace trace_endpoint_test's test_http_clear_settings, as Triton answers it.
    traces = TraceSettings(START, trace_file="global_unittest.log")
    traces.update({"trace_rate": ["12"], "log_frequency": ["34"]}, model="simple")
    traces.update({"trace_rate": ["56"], "trace_count": ["78"], "trace_level": ["OFF"]})
    assert _shown(traces.get("simple"))["trace_count"] == "78"  # rebuilt over the new global settings
    traces.update({"trace_rate": [], "trace_count": []})
    model = _shown(traces.get("simple"))
    assert (model["trace_level"], model["trace_rate"], model["trace_count"], model["log_frequency"]) == \
        (["OFF"], "12", "-1", "34")
    model = _shown(traces.update({"trace_rate": [], "trace_level": []}, model="simple"))
    assert (model["trace_level"], model["trace_rate"], model["log_frequency"]) == (["OFF"], "1", "34")
    traces.update({"log_frequency": []}, model="simple")  # nothing of its own: the global scope again
    assert traces.scope("simple") is traces.scope()


def test_a_non_zero_rate_is_needed_while_tracing():
    traces = TraceSettings(START)
    with pytest.raises(InvalidInput, match="Attempting to set invalid trace setting :sample rate must be non-zero"):
        traces.update({"trace_rate": ["0"]})
    assert traces.update({"trace_rate": ["0"], "trace_level": ["OFF"]})["trace_rate"] == ["0"]  # off: allowed


def test_the_trace_file_refusal_is_tritons_text():
    with pytest.raises(NotSupported) as refused:
        TraceSettings().update({"trace_file": ["model.log"]}, model="simple")
    assert str(refused.value.message) == "trace file location can not be updated through network protocol"


def test_tracing_says_whether_any_scope_traces():
    """Where no scope's level has TIMESTAMPS, requests are not sampled at all (the data plane asks this first)."""
    settings = TraceSettings()
    assert not settings.tracing
    settings.update({"trace_level": ["TIMESTAMPS"]}, model="m")
    assert settings.tracing
    settings.update({"trace_level": []}, model="m")
    assert not settings.tracing
    settings.update({"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert settings.tracing
    assert TraceSettings(TraceValues(level=("TIMESTAMPS",))).tracing
