"""tritonserver's trace flags, as Triton spells them, turned into the appliance's trace settings.

``--trace-config <setting>=<value>`` sets a global setting (``level``, ``rate``, ``count``, ``mode``);
``--trace-config triton,<setting>=<value>`` one of Triton's trace files (``file``, ``log-frequency``);
``--trace-config opentelemetry,<setting>=<value>`` the OpenTelemetry export (``url``, ``resource`` (repeated,
``key=value``), ``bsp_max_queue_size``, ``bsp_schedule_delay``, ``bsp_max_export_batch_size``).
The deprecated ``--trace-file``, ``--trace-level``, ``--trace-rate``, ``--trace-count`` and
``--trace-log-frequency`` are accepted too, and ``--trace-config`` wins over them, as in Triton. Levels
add up over repeated flags and OFF anywhere turns tracing off (Triton's ``--trace-config level=OFF``).
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.core.errors import ConfigError

__all__ = ["TRACE_SPELLINGS", "trace_flags"]

TRACE_SPELLINGS = {
    "trace_level": "--trace-config level=", "trace_rate": "--trace-config rate=",
    "trace_count": "--trace-config count=",
    "trace_log_frequency": "--trace-config triton,log-frequency=", "trace_mode": "--trace-config mode=",
    "trace_path": "--trace-config triton,file=",
    "trace_otel_url": "--trace-config opentelemetry,url=",
    "trace_otel_resource": "--trace-config opentelemetry,resource=",
    "trace_otel_bsp_max_queue_size": "--trace-config opentelemetry,bsp_max_queue_size=",
    "trace_otel_bsp_schedule_delay": "--trace-config opentelemetry,bsp_schedule_delay=",
    "trace_otel_bsp_max_export_batch_size": "--trace-config opentelemetry,bsp_max_export_batch_size=",
}
"""Each trace setting's flag, as tritonserver spells it."""

_LEVELS = {"off": "OFF", "false": "OFF", "true": "TIMESTAMPS", "on": "TIMESTAMPS", "min": "TIMESTAMPS",
           "max": "TIMESTAMPS", "timestamps": "TIMESTAMPS", "tensors": "TENSORS"}
_MODES = ("triton", "opentelemetry")
_OTEL_NUMBERS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


def trace_flags(config: Sequence[str] = (), *, file: str | None = None, levels: Sequence[str] = (),
                rate: int | None = None, count: int | None = None, log_frequency: int | None = None
                ) -> dict[str, object]:
    """The settings (trace_path, trace_level, trace_rate, trace_count, trace_log_frequency, trace_mode,
    trace_otel_*) the flags name; those not named are left out, so the settings file and environment
    still apply."""
    flags: dict[str, object] = {}
    resources: list[str] = []
    named_levels = [_level(value, "--trace-level") for value in levels]
    for name, value in (("trace_path", file), ("trace_rate", rate), ("trace_count", count),
                        ("trace_log_frequency", log_frequency)):
        if value is not None:
            flags[name] = value
    for option in config:
        mode, setting, value = _split(option)
        if mode == "opentelemetry":
            if setting == "url":
                flags["trace_otel_url"] = value
            elif setting == "resource":
                if "=" not in value or not value.partition("=")[0]:
                    raise ConfigError(f"--trace-config {option}: a resource is key=value, e.g. "
                                      "opentelemetry,resource=service.name=triton")
                resources.append(value)
            elif setting in _OTEL_NUMBERS:
                flags[f"trace_otel_{setting}"] = _integer(option, value)
            else:
                raise ConfigError(f'Bad option: "--trace-config opentelemetry,{setting}": the opentelemetry '
                                  f"settings are url, resource and {', '.join(_OTEL_NUMBERS)}")
        elif mode == "triton":
            if setting == "file":
                flags["trace_path"] = value
            elif setting == "log-frequency":
                flags["trace_log_frequency"] = _integer(option, value)
            else:
                raise ConfigError(f'Bad option: "--trace-config triton,{setting}": the triton settings are file '
                                  "and log-frequency")
        elif setting == "level":
            named_levels.append(_level(value, f"--trace-config {option}"))
        elif setting in ("rate", "count"):
            flags[f"trace_{setting}"] = _integer(option, value)
        elif setting == "mode":
            if value.lower() not in _MODES:
                raise ConfigError(f'invalid value for trace mode option: {value}. Available options are "triton" '
                                  'and "opentelemetry"')
            flags["trace_mode"] = value.lower()
        else:
            raise ConfigError(f'Bad option: "--trace-config {setting}": the global trace settings are level, rate, '
                              "count and mode; file and log-frequency take the mode: triton,file=<path>")
    if resources:
        flags["trace_otel_resource"] = tuple(resources)
    if named_levels:
        flags["trace_level"] = ("OFF",) if "OFF" in named_levels else tuple(dict.fromkeys(named_levels))
    return flags


def _split(option: str) -> tuple[str, str, str]:
    """Triton's ParseTraceConfigOption: ``[<mode>,]<setting>=<value>``."""
    mode, comma, rest = option.partition(",")
    if not comma:
        mode, rest = "", option
    elif not mode:
        raise ConfigError(f"No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                          f"or <setting>=<value>. Got {option}")
    elif mode.lower() not in _MODES:
        raise ConfigError(f'invalid value for trace mode option: {mode}. Available options are "triton" and '
                          '"opentelemetry"')
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ConfigError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {option}")
    return mode.lower(), setting, value


def _level(value: str, flag: str) -> str:
    try:
        return _LEVELS[value.strip().lower()]
    except KeyError:
        raise ConfigError(f"{flag}: invalid value for trace level option: {value}; use OFF, TIMESTAMPS or "
                          "TENSORS") from None


def _integer(option: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f'Bad option: "--trace-config {option}": expected an integer, got {value!r}') from None
