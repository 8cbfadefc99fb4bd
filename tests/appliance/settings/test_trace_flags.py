"""tritonserver's trace flags (``--trace-config`` and the deprecated ones) as the appliance's settings."""

from __future__ import annotations

import re

import pytest

from appliance.core.errors import ConfigError
from appliance.settings import load_settings
from appliance.settings.trace_flags import trace_flags


def test_tritons_spelling_becomes_the_trace_settings():
    flags = trace_flags(["triton,file=bls_trace.log", "level=TIMESTAMPS", "rate=4", "count=6", "mode=triton",
                         "triton,log-frequency=3"])
    assert flags == {"trace_path": "bls_trace.log", "trace_level": ("TIMESTAMPS",), "trace_rate": 4,
                     "trace_count": 6, "trace_mode": "triton", "trace_log_frequency": 3}
    trace = load_settings({**flags, "state_dir": "/tmp/x"}).trace
    assert (trace.path, trace.level, trace.rate, trace.count, trace.log_frequency) == \
        ("bls_trace.log", ("TIMESTAMPS",), 4, 6, 3)


@pytest.mark.parametrize(("levels", "expected"), [
    (["TIMESTAMPS", "TENSORS"], ("TIMESTAMPS", "TENSORS")),
    (["tensors", "max"], ("TENSORS", "TIMESTAMPS")),
    (["TIMESTAMPS", "OFF"], ("OFF",)),  # OFF anywhere turns tracing off, as in Triton
])
def test_levels_add_up_and_off_wins(levels, expected):
    assert trace_flags([f"level={level}" for level in levels])["trace_level"] == expected
    off_or_on = load_settings({"state_dir": "/tmp/x", "trace_level": expected}).trace.level
    assert off_or_on == (() if "OFF" in expected else tuple(sorted(expected, key=["TIMESTAMPS", "TENSORS"].index)))


def test_trace_config_wins_over_the_deprecated_flags():
    flags = trace_flags(["rate=5", "triton,file=new.log"], file="old.log", levels=["TENSORS"], rate=7, count=2,
                        log_frequency=9)
    assert flags == {"trace_path": "new.log", "trace_rate": 5, "trace_count": 2, "trace_log_frequency": 9,
                     "trace_level": ("TENSORS",)}
    assert trace_flags() == {}  # nothing named: the settings file and environment still apply


def test_opentelemetry_flags_as_triton_spells_them():
    assert trace_flags(["mode=opentelemetry", "opentelemetry,url=collector:4318/v1/traces",
                        "opentelemetry,resource=service.name=edge", "opentelemetry,resource=test.key=test.value",
                        "opentelemetry,bsp_schedule_delay=200", "opentelemetry,bsp_max_queue_size=64",
                        "opentelemetry,bsp_max_export_batch_size=32"]) == {
        "trace_mode": "opentelemetry", "trace_otel_url": "collector:4318/v1/traces",
        "trace_otel_resource": ("service.name=edge", "test.key=test.value"), "trace_otel_bsp_schedule_delay": 200,
        "trace_otel_bsp_max_queue_size": 64, "trace_otel_bsp_max_export_batch_size": 32}
    settings = load_settings({"state_dir": "/tmp/x", "trace_mode": "opentelemetry",
                              "trace_otel_url": "collector:4318/v1/traces"})
    assert settings.trace.otel_url == "http://collector:4318/v1/traces"  # Triton's url has no scheme


@pytest.mark.parametrize(("config", "message"), [
    ("level=LOUD", "invalid value for trace level option: LOUD"),
    ("rate", "option format is '<trace mode>,<setting>=<value>'. Got rate"),
    (",file=x", "No trace mode specified"),
    ("zipkin,file=x", 'invalid value for trace mode option: zipkin. Available options are "triton"'),
    ("triton,rate=1", 'Bad option: "--trace-config triton,rate"'),
    ("file=x", 'Bad option: "--trace-config file"'),
    ("rate=often", "expected an integer"),
    ("opentelemetry,port=4318", 'Bad option: "--trace-config opentelemetry,port"'),
    ("opentelemetry,resource=nokey", "a resource is key=value"),
    ("opentelemetry,bsp_schedule_delay=soon", "expected an integer"),
])
def test_bad_flags_say_what_is_wrong(config, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        trace_flags([config])


@pytest.mark.parametrize(("values", "message"), [
    ({"trace_mode": "zipkin"}, 'Available options are "triton" and "opentelemetry"'),
    ({"trace_otel_url": "ftp://collector"}, "trace_otel_url must be an OTLP/HTTP URL"),
    ({"trace_otel_resource": ("nokey",)}, "trace_otel_resource entries are key=value"),
    ({"trace_otel_bsp_max_export_batch_size": 4096}, "must be at most trace_otel_bsp_max_queue_size"),
    ({"trace_rate": -1}, "trace_rate must be 0..4294967295"),
    ({"trace_count": -2}, "trace_count must be -1.."),
    ({"trace_level": ("VERBOSE",)}, "trace_level must be OFF, or TIMESTAMPS and/or TENSORS"),
    ({"trace_path": "dir/"}, "trace_path must name a file"),
])
def test_bad_trace_settings_are_refused_at_start(values, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({"state_dir": "/tmp/x", **values})
