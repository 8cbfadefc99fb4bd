"""What BoxPool and AsyncBoxPool share: their box bookkeeping and the retry rules of one request.

The two pools differ only in how they wait and how they send (a thread and tritonclient, or the event
loop and aiohttp/grpc.aio); which box is tried next, what an outcome does to the routing state and when
to give up live here once, so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from appliance.client.boxes import PROTOCOLS, Box
from appliance.client.routing import Router
from appliance.client.transport import Refused, Unreachable
from appliance.client.trust import TokenPolicy, TrustStore

__all__ = ["Attempts", "PoolBase", "as_boxes", "infer_options", "token_policy"]

log = logging.getLogger(__name__)


def as_boxes(boxes: Sequence[Box | str]) -> list[Box]:
    return [box if isinstance(box, Box) else Box.at(box) for box in boxes]


def infer_options(outputs: Any, model_version: str, request_id: str, parameters: dict | None,
                  headers: dict | None, priority: int, timeout: int | None, sequence_id: int | str = 0,
                  sequence_start: bool = False, sequence_end: bool = False) -> dict[str, Any]:
    return {"outputs": outputs, "model_version": model_version, "request_id": request_id,
            "parameters": parameters, "headers": headers, "priority": priority, "timeout": timeout,
            "sequence_id": sequence_id, "sequence_start": sequence_start, "sequence_end": sequence_end}


def token_policy(token: str | None, trusted_boxes: TrustStore | str | Path | None, named: bool,
                 pool: str) -> TokenPolicy:
    """Where a pool's bearer token may go: see TokenPolicy."""
    trusted = trusted_boxes if isinstance(trusted_boxes, TrustStore) or trusted_boxes is None else (
        TrustStore.load(trusted_boxes))
    if token is not None and not named and trusted is None:
        log.warning("%s: the token goes to no box found on the LAN (a box merely found there is not trusted "
                    "with it); pin your boxes (appliance fleet trust NAME) and pass trusted_boxes=<the pins "
                    "file>, or name the boxes", pool)
    return TokenPolicy(token, trusted, named)


class PoolBase:
    """The router and the box views of a pool; ``_want`` asks the pool to re-read one box's models."""

    def __init__(self, protocol: str, cooldown: float, retry_deadline: float, busy_backoff: float,
                 tokens: TokenPolicy) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol = protocol
        self.retry_deadline = retry_deadline
        self._router = Router(cooldown, busy_backoff)
        self._tokens = tokens

    def boxes(self) -> list[Box]:
        return sorted(self._router.boxes(), key=lambda b: b.name)

    def healthy(self) -> list[Box]:
        """Boxes not cooling down after a failure."""
        return self._router.healthy()

    def stats(self) -> dict[str, dict]:
        """Per box: requests outstanding, latency estimate, READY models, requests served per model,
        refused (503) and unreachable (both retried elsewhere), failed (raised to the caller)."""
        return self._router.snapshot()

    def _want(self, name: str) -> None:
        raise NotImplementedError

    def _box_changed(self, box: Box, present: bool) -> None:
        if not present:
            self._router.remove(box.name)
        elif self._router.add(self._tokens.route(box)):
            self._want(box.name)

    def _attempts(self, model: str, options: dict[str, Any]) -> Attempts:
        sequence = options.get("sequence_id") or None
        return Attempts(self._router, model, self.protocol, time.monotonic() + self.retry_deadline, self._want,
                        None if sequence is None else (model, options.get("model_version", ""), sequence),
                        bool(options.get("sequence_end")))


class Attempts:
    """The attempts of one request: ``next_box`` (or ``next_box_async``) waits for a box to be free,
    send, then report the outcome: ``retry`` (Unreachable or Refused: choose again), ``failed`` (any
    other exception, raised to the caller) or ``succeeded``."""

    def __init__(self, router: Router, model: str, protocol: str, deadline: float,
                 want: Callable[[str], None], sequence: Hashable | None = None, ends: bool = False) -> None:
        self._router = router
        self._sequence = sequence
        self._ends = ends
        self._model = model
        self._protocol = protocol
        self._deadline = deadline
        self._want = want
        self._tried: set[str] = set()
        self._last: Exception | None = None
        self._started = 0.0

    def choose(self) -> Box | None:
        box = self._router.choose(self._model, self._protocol, self._tried, self._sequence)
        self._started = time.monotonic()
        return box

    def next_box(self) -> Box:
        """The box to send to, sleeping (this thread) while none is free; NoBoxAvailable past the deadline."""
        while (box := self.choose()) is None:
            time.sleep(self.pause())
        return box

    async def next_box_async(self) -> Box:
        """``next_box`` for the event loop."""
        while (box := self.choose()) is None:
            await asyncio.sleep(self.pause())
        return box

    def pause(self) -> float:
        """Seconds to wait before choosing again; NoBoxAvailable when waiting cannot help."""
        return self._router.pause(self._model, self._protocol, self._tried, self._deadline - time.monotonic(),
                                  self._last)

    def retry(self, box: Box, exc: Unreachable | Refused) -> None:
        if isinstance(exc, Unreachable):
            self._router.unreachable(box.name, exc.cool)
        elif exc.missing:
            self._router.missing(box.name, self._model)
            self._want(box.name)
        else:
            self._router.refused(box.name, exc.retry_after)
        self._tried.add(box.name)
        self._last = exc

    def failed(self, box: Box) -> None:
        self._router.failed(box.name)

    def succeeded(self, box: Box) -> None:
        self._router.succeeded(box.name, self._model, time.monotonic() - self._started)
        if self._sequence is not None and self._ends:
            self._router.unpin(self._sequence)
