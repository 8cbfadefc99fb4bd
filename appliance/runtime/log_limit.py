"""A logging filter that bounds repeated messages, so a flood (asyncio's accept errors when file
descriptors run out, refused connections, a client hammering a broken path) cannot flood the journal.

Records of one kind (logger, level and message template) pass ``burst`` times per ``interval``; the rest
are counted and dropped, and the first record of that kind after the interval is preceded by one line
saying how many were suppressed (as journald reports its own rate limiting).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RepeatFilter", "install"]

_SUMMARY = "suppressed_repeats"  # marks the summary records this filter makes (they always pass)


@dataclasses.dataclass(slots=True)
class _Window:
    start: float
    passed: int = 1
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """The filter of one handler; its summaries go to that handler."""

    def __init__(self, handler: logging.Handler, burst: int = 5, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = 1024) -> None:
        super().__init__()
        self._handler = handler
        self._burst = burst
        self._interval = interval
        self._clock = clock
        self._max_kinds = max_kinds
        self._windows: dict[tuple, _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window.start < self._interval:
                if window.passed < self._burst:
                    window.passed += 1
                    return True
                window.suppressed += 1
                return False
            if window is None and len(self._windows) >= self._max_kinds:
                self._forget(now)
            self._windows[key] = _Window(now)
            suppressed = window.suppressed if window is not None else 0
            elapsed = now - window.start if window is not None else 0.0
        if suppressed:
            self._summarise(record, suppressed, elapsed)
        return True

    def _forget(self, now: float) -> None:
        """Drop kinds whose window is over (their unreported counts go with them), or the oldest half."""
        stale = [k for k, w in self._windows.items() if now - w.start >= self._interval]
        if not stale:
            stale = sorted(self._windows, key=lambda k: self._windows[k].start)[: self._max_kinds // 2]
        for key in stale:
            del self._windows[key]

    def _summarise(self, record: logging.LogRecord, suppressed: int, elapsed: float) -> None:
        what = str(record.msg).splitlines()[0][:200] if str(record.msg) else ""
        summary = logging.LogRecord(
            record.name, record.levelno, record.pathname, record.lineno,
            "suppressed %d similar messages in the last %.0f s: %s", (suppressed, elapsed, what), None,
        )
        setattr(summary, _SUMMARY, True)
        self._handler.handle(summary)


def install(handler: logging.Handler, burst: int = 5, interval: float = 10.0) -> RepeatFilter:
    """Bound repeats on ``handler`` (a handler's filters see every record that reaches it, whichever
    logger it came from)."""
    for existing in handler.filters:
        if isinstance(existing, RepeatFilter):
            return existing
    repeat_filter = RepeatFilter(handler, burst, interval)
    handler.addFilter(repeat_filter)
    return repeat_filter
