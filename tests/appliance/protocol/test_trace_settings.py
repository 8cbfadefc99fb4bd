"""Triton's trace settings: validated as Triton validates them, global and per model, cleared by an empty
value."""

from __future__ import annotations

import pytest

from appliance.errors import InvalidInput, NotSupported
from appliance.protocol.trace_settings import TraceSettings


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
