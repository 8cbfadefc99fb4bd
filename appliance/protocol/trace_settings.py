"""Triton's trace settings (the trace extension's settings, global and per model), free of any transport.

The settings live here: they are validated, stored and answered exactly as Triton does, so the gRPC
``TraceSetting`` RPC and REST ``/v2/trace/setting`` share one store, and ``appliance.protocol.tracing``
samples requests by them. ``trace_file`` reports where traces go; changing it over the network is
refused as Triton refuses it.

As in Triton's TraceManager, the settings in force for a scope (the global one, or a model that has
settings of its own) are one ``TraceScope``, replaced (never changed) by an update: a new scope starts
counting requests for ``trace_rate`` afresh and its traces go to files of their own when it writes
numbered files. A model's scope holds the fields set for it and takes the others from the global
scope, and is rebuilt when the global one changes; the global scope takes the fields not set over the
network from the start-up values (``--trace-config``).

Values travel as lists of strings (the protocol's ``SettingValue``); an empty list clears a setting: a
model's then follows the global one again, a global one returns to its start-up value.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

from appliance.core.errors import InvalidInput, NotSupported

__all__ = ["LEVELS", "TraceScope", "TraceSettings", "TraceValues"]

LEVELS = ("TIMESTAMPS", "TENSORS")
_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, 2**32 - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceValues:
    level: tuple[str, ...] = ()
    """Empty: OFF; else a subset of LEVELS."""
    rate: int = 1000
    """Trace one request in ``rate`` (the rate-th, 2*rate-th... as Triton)."""
    count: int = -1
    """Requests still to trace; -1: no limit."""
    log_frequency: int = 0
    """Start a new numbered trace file every this many traces; 0: one file."""


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
KNOWN = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")
_ids = itertools.count(1)


class TraceScope:
    """The settings in force for the global scope or one model's, with what sampling counts in them.

    Used from the event loop only. ``id`` names the scope's stream of traces for the writer."""

    __slots__ = ("id", "values", "specified", "count", "sampled", "created", "collected")

    def __init__(self, values: TraceValues, specified: frozenset[str]) -> None:
        self.id = next(_ids)
        self.values = values
        self.specified = specified
        """The fields set for this scope (a model's own; the global ones set over the network)."""
        self.count = values.count
        """Traces still allowed (-1: no limit), counted down as requests are traced."""
        self.sampled = 0
        """Requests counted for ``rate`` (Triton's sample_)."""
        self.created = self.collected = 0
        """Traces begun in this scope, and finished."""

    def sample(self) -> bool:
        """Count one request; True if it is to be traced (Triton's TraceSetting::SampleTrace)."""
        values = self.values
        if "TIMESTAMPS" not in values.level or values.rate < 1 or self.count == 0:
            return False
        self.sampled += 1
        if self.sampled % values.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self.created += 1
        return True

    def collect(self) -> bool:
        """One of this scope's traces finished; True if it is the last the scope will have (its
        trace_count ran out and every trace it began is done), which closes its numbered file."""
        self.collected += 1
        return self.count == 0 and self.collected == self.created

    @property
    def limited(self) -> bool:
        """Traces are counted (trace_count was not -1 when the scope began)."""
        return self.values.count >= 0

    def current(self) -> TraceValues:
        return dataclasses.replace(self.values, count=self.count)


class TraceSettings:
    def __init__(self, defaults: TraceValues | None = None, trace_file: str = "", mode: str = "triton") -> None:
        self._defaults = defaults or TraceValues()
        self._global = TraceScope(self._defaults, frozenset())
        self._models: dict[str, TraceScope] = {}
        """Only models with settings of their own; the others use the global scope."""
        self._file = trace_file
        self._mode = mode
        self.tracing = "TIMESTAMPS" in self._defaults.level
        """Whether any scope traces (its level has TIMESTAMPS): where none does, a request is not
        sampled at all (``Tracer.start`` is not asked)."""

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
        return self.scope(model).current()

    def scope(self, model: str | None = None) -> TraceScope:
        """The scope a request to ``model`` is sampled in (the model's own, else the global one)."""
        return self._models.get(model, self._global) if model else self._global

    def update(self, changes: Mapping[str, Sequence[str]], model: str | None = None) -> dict[str, list[str]]:
        """Apply ``changes`` (all or none of them) to the global settings or to ``model``'s; the model's
        existence is the caller's to check. Returns the settings now in force."""
        parsed: dict[str, object] = {}
        cleared: set[str] = set()
        for key, raw in changes.items():
            values = [str(v) for v in raw]
            if key == "trace_file":
                raise NotSupported("trace file location can not be updated through network protocol")
            if key == "trace_mode":
                raise NotSupported("trace_mode can not be updated through network protocol")
            if key not in _FIELDS:
                raise InvalidInput(f"unknown trace setting {key[:80]!r}; the settings are {', '.join(KNOWN)}")
            if not values:
                cleared.add(_FIELDS[key])
            elif key == "trace_level":
                parsed["level"] = _level(values)
            else:
                parsed[_FIELDS[key]] = _integer(key, values, _INT32 if key == "trace_count" else _UINT32)
        if model:
            self._rebuild(model, parsed, cleared)
        else:
            self._global = self._derive(self._global, self._defaults, parsed, cleared)
            for name in list(self._models):  # models that take fields from the global scope follow it
                self._rebuild(name, {}, set())
        self.tracing = any("TIMESTAMPS" in scope.values.level for scope in (self._global, *self._models.values()))
        return self.get(model)

    def _rebuild(self, model: str, parsed: Mapping[str, object], cleared: set[str]) -> None:
        current = self._models.get(model)
        scope = self._derive(current, self._global.current(), parsed, cleared)
        if scope.specified:
            self._models[model] = scope
        else:
            self._models.pop(model, None)  # nothing of its own: it uses the global scope again

    @staticmethod
    def _derive(current: TraceScope | None, fallback: TraceValues, parsed: Mapping[str, object],
                cleared: set[str]) -> TraceScope:
        """Triton's UpdateTraceSettingInternal: the fallback's values, with the fields set (now or
        before, unless cleared now) taken from the change or the current scope."""
        specified = ((current.specified if current else frozenset()) | set(parsed)) - cleared
        own = current.current() if current else fallback
        values = dataclasses.replace(fallback, **{field: parsed.get(field, getattr(own, field))  # type: ignore[arg-type]
                                                  for field in specified})
        if parsed and values.level and values.rate == 0:  # the one invalid setting allowed disables tracing
            raise InvalidInput("Attempting to set invalid trace setting :sample rate must be non-zero")
        return TraceScope(values, frozenset(specified))


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
