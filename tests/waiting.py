"""Waiting on a condition instead of sleeping a fixed time: the test goes on as soon as what it waits for is
true, and a condition that never comes fails with what was awaited (never a silent pass)."""

from __future__ import annotations

import asyncio
import errno
import os
import time
import types
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import TypeVar

__all__ = ["await_until", "next_turn", "open_gate", "wait_until"]

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


def open_gate(fifo: Path, timeout: float = 30.0) -> None:
    """Let through whoever waits at the gate ``fifo`` (a FIFO made with os.mkfifo): a model's code, in its own
    process, waits there with ``open(fifo).close()``, which returns once a writer opens the FIFO. Waits up to
    ``timeout`` seconds for someone to be waiting (AssertionError when no one comes); all those waiting go on."""
    def opened() -> bool:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader has it open yet
                raise
            return False
        return True

    wait_until(opened, timeout=timeout, what=f"someone waiting at {fifo}")


async def next_turn(turns: int = 1) -> None:
    """Give the event loop ``turns`` turns: each time, the calling task goes behind what is ready to run (the
    callbacks and tasks scheduled so far), as an asyncio sleep of zero seconds does. Not a wait: no time is meant
    to pass, for a test whose point is how the loop interleaves its work."""
    for _ in range(turns):
        await _bare_yield()


@types.coroutine
def _bare_yield() -> Generator[None, None, None]:
    yield  # a task that yields nothing is scheduled again at once, behind the ready callbacks


def _name(predicate: Callable) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))
