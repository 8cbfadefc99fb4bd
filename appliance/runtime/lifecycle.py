"""Resources started in order and stopped in reverse, as aiohttp's ``cleanup_ctx`` does: a resource
that fails to stop never keeps the ones before it from stopping, and its error is logged and returned,
never lost."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

__all__ = ["Lifecycle"]

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self) -> None:
        self._closers: list[tuple[str, Callable[[], Awaitable[object]]]] = []

    def on_close(self, name: str, closer: Callable[[], Awaitable[object]]) -> None:
        """Run ``closer`` at close, before everything registered earlier."""
        self._closers.append((name, closer))

    async def close(self) -> list[BaseException]:
        """Close everything, newest first; the errors, each already logged."""
        errors: list[BaseException] = []
        while self._closers:
            name, closer = self._closers.pop()
            try:
                await closer()
            except Exception as exc:  # noqa: BLE001 - collected, so the rest still stops
                log.error("error while stopping %s: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
                errors.append(exc)
        return errors
