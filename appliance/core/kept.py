"""What the tables that remember a client's key sets may keep (the request parameters' keys of a
sequence's steps, read once per set): a set of at most 8 strings of at most 64 characters. A client's
long or many keys are read every time and never kept, so a table of 256 sets holds at most 128 KiB of
keys whatever clients send."""

from __future__ import annotations

__all__ = ["KEPT_KEY_SETS", "MAX_KEPT_KEYS", "MAX_KEPT_KEY_LENGTH", "kept_keys"]

KEPT_KEY_SETS = 256
"""The most key sets one such table keeps (it is cleared when full)."""
MAX_KEPT_KEYS = 8
MAX_KEPT_KEY_LENGTH = 64


def kept_keys(keys: tuple[object, ...]) -> bool:
    """Whether a table of key sets may keep ``keys``."""
    return len(keys) <= MAX_KEPT_KEYS and all(type(key) is str and len(key) <= MAX_KEPT_KEY_LENGTH for key in keys)
