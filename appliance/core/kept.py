"""The bounded tables that remember what was read or made before (a header's parse, a key set's verdict, an
answer's JSON header): each holds a bounded number of entries and is emptied when full (``remember``),
and what a client sends is kept only when small. A key set (a request's parameters' keys, the same on
every step of a sequence) is kept when it has at most 8 strings of at most 64 characters: a client's
long or many keys are read every time and never kept, so a table of 256 sets holds at most 128 KiB of
keys whatever clients send."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["KEPT_KEY_SETS", "MAX_KEPT_KEYS", "MAX_KEPT_KEY_LENGTH", "kept_keys", "remember"]

KEPT_KEY_SETS = 256
"""The most key sets one such table keeps."""
MAX_KEPT_KEYS = 8
MAX_KEPT_KEY_LENGTH = 64

_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


def remember(table: dict[_Key, _Value], key: _Key, value: _Value, most: int) -> None:
    """Keep ``value`` under ``key`` in ``table``, which is emptied first when it holds ``most`` already."""
    if len(table) >= most:
        table.clear()
    table[key] = value


def kept_keys(keys: tuple[object, ...]) -> bool:
    """Whether a table of key sets may keep ``keys``."""
    return len(keys) <= MAX_KEPT_KEYS and all(type(key) is str and len(key) <= MAX_KEPT_KEY_LENGTH for key in keys)
