"""Property-based fuzzing of the settings a client changes over the network: Triton's trace settings
(``appliance.protocol.trace_settings``: lists of strings from REST's JSON or gRPC's SettingValue) and log
settings (``appliance.protocol.log_settings``: the JSON body of POST /v2/logging as it comes).

Properties: any change is applied whole or refused whole with the protocol's own error (400, or 501 for
what no network client may change), and what the settings answer afterwards is what was applied.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core.errors import NotSupported
from appliance.protocol.log_settings import LogSettings, LogValues
from appliance.protocol.trace_settings import KNOWN, TraceSettings
from tests.appliance.strategies_fuzz import assert_client_error, json_values

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of stalling CI

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _assert_refusal(exc: BaseException) -> None:
    if not isinstance(exc, NotSupported):
        assert_client_error(exc)


_NUMBERS = st.integers(-(2**33), 2**33).map(str) | st.sampled_from(["", " 7 ", "1_0", "0x10", "1e3", "١٢", "9" * 5000])
_VALUES = st.lists(st.sampled_from(["OFF", "TIMESTAMPS", "TENSORS", "timestamps"]) | _NUMBERS | st.text(max_size=6),
                   max_size=3)


@FUZZ
@given(changes=st.lists(st.dictionaries(st.sampled_from(KNOWN) | st.text(max_size=6), _VALUES, max_size=4),
                        min_size=1, max_size=3),
       models=st.lists(st.none() | st.sampled_from(["a", "b"]), min_size=3, max_size=3))
def test_trace_setting_changes_apply_whole_or_not_at_all(changes, models):
    traces = TraceSettings(trace_file="/tmp/trace.json")
    for change, model in zip(changes, models, strict=False):
        before = {scope: traces.get(scope) for scope in (None, "a", "b")}
        try:
            answer = traces.update(change, model)
        except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
            _assert_refusal(exc)
            assert {scope: traces.get(scope) for scope in (None, "a", "b")} == before  # nothing applied
            continue
        assert answer == traces.get(model)
        values = traces.values(model)
        assert 0 <= values.rate < 2**32 and -1 <= values.count < 2**31 and 0 <= values.log_frequency < 2**32
        assert not (values.level and values.rate == 0)
        for key, raw in change.items():
            if raw and key == "trace_rate":
                assert values.rate == int(raw[0].strip())


_LOG_KEYS = st.sampled_from(["log_info", "log_warning", "log_error", "log_verbose_level", "log_format", "log_file"])


@FUZZ
@given(changes=st.dictionaries(_LOG_KEYS | st.text(max_size=6),
                               json_values(2) | st.sampled_from(["default", "ISO8601", 0, 1, 2**32, True]), max_size=4))
def test_log_setting_changes_apply_whole_or_not_at_all(changes):
    logger = logging.getLogger("tests.fuzz.log_settings")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    logs = LogSettings(logger, LogValues(), log_file="")
    before = logs.get()
    try:
        try:
            answer = logs.update(changes)
        except Exception as exc:  # noqa: BLE001
            _assert_refusal(exc)
            assert logs.get() == before
            return
        assert answer == {**before, **changes}
    finally:
        logs.restore()
        logger.removeHandler(handler)
    assert logger.level == logging.NOTSET and not handler.filters
