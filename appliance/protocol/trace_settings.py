"""Triton's trace settings (the trace extension's settings, global and per model), free of any transport.

The settings live here: they are validated, stored and answered exactly as Triton does, so the gRPC
``TraceSetting`` RPC and REST ``/v2/trace/setting`` share one store, and ``appliance.protocol.tracing``
samples requests by them. ``trace_file`` reports where traces go (under the state dir); changing it
over the network is refused as Triton refuses it.

Values travel as lists of strings (the protocol's ``SettingValue``); an empty list clears a setting: a
model's then follows the global one again, a global one returns to its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from appliance.errors import InvalidInput, NotSupported

__all__ = ["LEVELS", "TraceSettings", "TraceValues"]

LEVELS = ("TIMESTAMPS", "TENSORS")
_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceValues:
    level: tuple[str, ...] = ()
    """Empty: OFF; else a subset of LEVELS."""
    rate: int = 1000
    """Trace one request in ``rate``."""
    count: int = -1
    """Requests still to trace; -1: no limit."""
    log_frequency: int = 0
    """Start a new trace file every this many traces; 0: one file."""


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
KNOWN = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


class TraceSettings:
    def __init__(self, defaults: TraceValues | None = None, trace_file: str = "", mode: str = "triton") -> None:
        self._defaults = defaults or TraceValues()
        self._global = self._defaults
        self._models: dict[str, dict[str, object]] = {}
        """Per model: only the settings set for that model; the rest follow the global ones."""
        self._file = trace_file
        self._mode = mode

    def get(self, model: str | None = None) -> dict[str, list[str]]:
        """The settings in force for ``model`` (or the global ones), as the protocol answers them."""
        values = self.values(model)
        return {
            "trace_level": list(values.level) or ["OFF"],
            "trace_rate": [str(values.rate)],
            "trace_count": [str(values.count)],
            "log_frequency": [str(values.log_frequency)],
            "trace_file": [self._file],
            "trace_mode": [self._mode],
        }

    def values(self, model: str | None = None) -> TraceValues:
        """The values in force for ``model`` (its own settings over the global ones)."""
        if model and model in self._models:
            return dataclasses.replace(self._global, **self._models[model])  # type: ignore[arg-type]
        return self._global

    def consume(self, model: str | None = None) -> None:
        """One request was traced: count it off ``trace_count`` where that count is set (the model's own,
        else the global one); -1 (no limit) stays."""
        own = self._models.get(model, {}) if model else {}
        count = own.get("count", self._global.count)
        assert isinstance(count, int)
        if count <= 0:
            return
        if "count" in own:
            own["count"] = count - 1
        else:
            self._global = dataclasses.replace(self._global, count=count - 1)

    def update(self, changes: Mapping[str, Sequence[str]], model: str | None = None) -> dict[str, list[str]]:
        """Apply ``changes`` (all or none of them) to the global settings or to ``model``'s; the model's
        existence is the caller's to check. Returns the settings now in force."""
        parsed: dict[str, object] = {}
        cleared: list[str] = []
        for key, raw in changes.items():
            values = [str(v) for v in raw]
            if key == "trace_file":
                raise NotSupported("trace file location can not be updated through network protocol; set it in "
                                  "the daemon's settings")
            if key == "trace_mode":
                raise NotSupported("trace_mode can not be updated through network protocol")
            if key not in _FIELDS:
                raise InvalidInput(f"unknown trace setting {key[:80]!r}; the settings are {', '.join(KNOWN)}")
            if not values:
                cleared.append(_FIELDS[key])
            elif key == "trace_level":
                parsed["level"] = _level(values)
            else:
                parsed[_FIELDS[key]] = _integer(key, values, _INT32 if key == "trace_count" else _UINT32)
        if model:
            current = self._models.setdefault(model, {})
            for field in cleared:
                current.pop(field, None)
            current.update(parsed)
            if not current:
                del self._models[model]
        else:
            reset = {field: getattr(self._defaults, field) for field in cleared}
            self._global = dataclasses.replace(self._global, **reset, **parsed)  # type: ignore[arg-type]
        return self.get(model)


def _level(values: list[str]) -> tuple[str, ...]:
    if "OFF" in values:
        if len(values) > 1:
            raise InvalidInput("Expect only one trace level 'OFF' is specified")
        return ()
    unknown = [v for v in values if v not in LEVELS]
    if unknown:
        raise InvalidInput(f"unknown trace level {unknown[0][:40]!r}; use OFF, or one or both of {', '.join(LEVELS)}")
    return tuple(level for level in LEVELS if level in values)


def _integer(key: str, values: list[str], bounds: tuple[int, int]) -> int:
    if len(values) != 1:
        raise InvalidInput(f"expect only 1 value for '{key}'")
    text = values[0].strip()
    try:
        number = int(text)
    except ValueError:
        raise InvalidInput(f"Unable to parse '{key}', got: {text[:40]}") from None
    low, high = bounds
    if key == "trace_count" and number < -1:
        raise InvalidInput(f"'{key}' must be -1 (no limit) or a count >= 0, got {number}")
    if not low <= number <= high:
        raise InvalidInput(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text[:40]}")
    return number
