"""The stop every front end keeps (``appliance.protocol.front_end.FrontEnd.stop``), in one place: once a
front end has stopped listening and told its connections to take no new request (closing the idle ones),
the requests in progress get until the daemon's one deadline; what still runs then is cancelled, given
``CANCEL_GRACE`` seconds to end, and counted in the log. The HTTP port (aiohttp's connections and the
infer lane's) and the gRPC port wait here alike."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CANCEL_GRACE", "finish_by"]

log = logging.getLogger(__name__)

CANCEL_GRACE = 0.5
"""Seconds the requests cancelled at the stop deadline get to end (to answer their cancellation)."""


def _cancel(work: asyncio.Future[Any]) -> None:
    work.cancel()


async def finish_by(deadline: float, work: Iterable[asyncio.Future[Any]], what: str = "request(s)",
                    cancel: Callable[[asyncio.Future[Any]], None] = _cancel) -> int:
    """Wait for ``work`` until ``deadline`` (``time.monotonic()``), then ``cancel`` what is left (by default
    the future's own ``cancel``; a front end may close its connection as well) and give it
    ``CANCEL_GRACE`` seconds to end; how many were cut, logged as "<n> <what> still running at the
    shutdown deadline: cancelled"."""
    pending = set(work)
    if not pending:
        return 0
    _, late = await asyncio.wait(pending, timeout=max(deadline - time.monotonic(), 0.0))
    if not late:
        return 0
    for future in late:
        cancel(future)
    await asyncio.wait(late, timeout=CANCEL_GRACE)
    for future in late:
        if future.done() and not future.cancelled():
            future.exception()  # seen here: a cut request's error is the stop's, not a stray log line
    log.warning("%d %s still running at the shutdown deadline: cancelled", len(late), what)
    return len(late)
