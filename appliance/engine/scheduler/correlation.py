"""A request's place in a sequence: its correlation ID and START/END flags, read from the request
parameters both front ends fill (``sequence_id``, ``sequence_start``, ``sequence_end``), with Triton's
errors word for word (clients match on them) followed by the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from appliance.core.errors import InvalidInput
from appliance.engine.scheduler.sequence_policy import Control

__all__ = ["END", "MAX_STRING_ID_BYTES", "START", "SequenceIds", "sequence_ids"]

START = 1
END = 2
MAX_STRING_ID_BYTES = 256
"""A string correlation ID longer than this is refused: IDs are kept per sequence."""
_INT_RANGES = {"UINT64": (0, 2**64 - 1), "INT64": (0, 2**63 - 1), "UINT32": (0, 2**32 - 1), "INT32": (0, 2**31 - 1)}


class SequenceIds(NamedTuple):
    """(A tuple: one is made for every request, and a frozen dataclass sets each field through
    ``object.__setattr__``.)"""

    corrid: int | str
    flags: int

    @property
    def start(self) -> bool:
        return bool(self.flags & START)

    @property
    def end(self) -> bool:
        return bool(self.flags & END)


def _flag(parameters: Mapping[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if type(value) is not bool:
        raise InvalidInput(f"'{key}' must be a boolean (true or false), got {value!r}"[:200])
    return value


def sequence_ids(parameters: Mapping[str, Any], model: str, corrid_control: Control | None) -> SequenceIds:
    """The request's sequence; InvalidInput (Triton's words first) when a sequence model cannot take it."""
    corrid = parameters.get("sequence_id", 0)
    start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
    if type(start) is not bool or type(end) is not bool:  # (``_flag``'s test inline: every step passes here)
        _flag(parameters, "sequence_start")
        _flag(parameters, "sequence_end")
    flags = (START if start else 0) | (END if end else 0)
    if isinstance(corrid, str):
        if len(corrid.encode()) > MAX_STRING_ID_BYTES:
            raise InvalidInput(f"'sequence_id' is longer than {MAX_STRING_ID_BYTES} bytes; use a shorter ID")
        given = "BYTES"
    elif type(corrid) is int:
        if not 0 <= corrid < 2**64:
            raise InvalidInput(f"'sequence_id' {corrid} is outside the uint64 range 0..2^64-1")
        given = "UINT64"
    else:
        raise InvalidInput(f"'sequence_id' must be an unsigned integer or a string, got {corrid!r}"[:200])
    if corrid in (0, ""):
        raise InvalidInput(
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID: send the "
            "sequence_id parameter (tritonclient: infer(..., sequence_id=N, sequence_start=True) on the first request)"
        )
    if corrid_control is not None:
        expected = "BYTES" if corrid_control.datatype == "BYTES" else "UINT64"
        # A string ID for a numeric CORRID is accepted, as Triton accepts it (appliance.engine.scheduler.
        # state fills the control as Triton does); an integer ID for a string CORRID is not.
        if given != expected and given != "BYTES":
            raise InvalidInput(
                f"sequence batching control '{corrid_control.name}' data-type is '{given}', but model '{model}' "
                f"expects '{expected}': send sequence_id as {'a string' if expected == 'BYTES' else 'an integer'}"
            )
        low, high = _INT_RANGES.get(corrid_control.datatype, (0, 0))
        if given == "UINT64" and not low <= int(corrid) <= high:
            raise InvalidInput(
                f"sequence_id {corrid} does not fit model '{model}''s {corrid_control.datatype} control "
                f"'{corrid_control.name}'; use an ID in {low + 1}..{high}"
            )
    return SequenceIds(corrid, flags)
