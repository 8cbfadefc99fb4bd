"""Waiting on a condition instead of sleeping a fixed time: the test goes on as soon as what it waits for is
true, and a condition that never comes fails with what was awaited (never a silent pass)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["await_until", "wait_until"]

T = TypeVar("T")

_POLL = 0.01


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "", interval: float = _POLL) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; AssertionError after ``timeout``
    seconds, naming ``what`` (or the predicate) and its last value. Exceptions of the predicate propagate."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or _name(predicate)} "
                                 f"(last: {value!r})")
        time.sleep(interval)


async def await_until(predicate: Callable[[], T | Awaitable[T]], timeout: float = 10.0, what: str = "",
                      interval: float = _POLL) -> T:
    """``wait_until`` on an event loop: ``predicate`` may be a plain or an async callable."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or _name(predicate)} "
                                 f"(last: {value!r})")
        await asyncio.sleep(interval)


def _name(predicate: Callable) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))
