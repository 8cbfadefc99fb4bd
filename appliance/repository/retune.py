"""Retune served models on their real traffic.

A model that could not be measured at load (unless only its calls to other models, which tuning cannot
serve, stopped it), or whose requests mostly have other shapes than the ones it was tuned on, is tuned
again on its traffic's shapes (in the tuning child process, at low CPU priority) and switched to the new
plan through the registry's reload: the new versions load beside the serving ones, requests in flight
finish on the old plan, and the versions' statistics count on. At most once per interval per model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from appliance.backends.base import calls_stopped_tuning
from appliance.engine.model import ModelVersion
from appliance.repository.registry import ModelRegistry, ModelState

__all__ = ["RetunePolicy", "Retuner", "why_retune"]

log = logging.getLogger(__name__)

DOMINANT_SHARE = 0.5
"""Other shapes must carry at least this share of the requests to count as the traffic's shapes."""


@dataclasses.dataclass(frozen=True, slots=True)
class RetunePolicy:
    interval: float
    """Seconds between two retunes of one model (and at most between two looks at the traffic)."""
    min_requests: int
    """Requests a version serves before its traffic is judged."""


def _item_shapes(sample: dict[str, Any], batched: bool) -> dict[str, list[int]]:
    return {name: list(shape[1:] if batched else shape) for name, shape in sample["shapes"].items()}


def why_retune(model: ModelVersion, policy: RetunePolicy) -> str | None:
    """Why ``model`` should be tuned again on its traffic, or None."""
    selection = model.selection or {}
    status = selection.get("status")
    if status not in ("measured", "unmeasured") or model.traffic.requests < policy.min_requests:
        return None
    dominant = model.traffic.dominant()
    if dominant is None:
        return None
    shapes, share = dominant
    tried = selection.get("traffic_profile") or {}
    tuned = [_item_shapes(s, model.signature.batched) for s in (selection.get("profile") or tried.get("samples") or [])]
    if status == "unmeasured" and shapes not in tuned:
        if calls_stopped_tuning(selection.get("inputs_refused") or []):
            return None  # it calls other models, which tuning cannot serve: no traffic would measure it
        return f"it could not be measured before; its traffic has shapes {shapes}"
    if status == "measured" and share >= DOMINANT_SHARE and shapes not in tuned:
        return (f"{share:.0%} of its requests have shapes {shapes}, which it was not tuned on "
                f"(tuned on {selection.get('tuned_on')} shapes {tuned})")
    return None


class Retuner:
    def __init__(self, registry: ModelRegistry, policy: RetunePolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._policy = policy
        self._clock = clock
        self._last: dict[str, float] = {}

    async def run(self, loaded: Callable[[], Awaitable[None]]) -> None:
        """Look at the traffic every interval (10 s at most) once the repository has loaded."""
        await loaded()
        while True:
            await asyncio.sleep(min(self._policy.interval, 10.0))
            try:
                await self.check()
            except Exception:  # the next look tries again; serving is never affected
                log.exception("looking at the models' traffic failed")

    async def check(self) -> list[str]:
        """Retune the models that need it (one at a time: tuning is serialised anyway); their names."""
        retuned = []
        for entry in self._registry.entries():
            if entry.state is not ModelState.READY:
                continue
            reasons = {number: why for number, model in entry.versions.items()
                       if (why := why_retune(model, self._policy)) is not None}
            last = self._last.get(entry.name)
            if not reasons or (last is not None and self._clock() - last < self._policy.interval):
                continue
            self._last[entry.name] = self._clock()
            for number, why in sorted(reasons.items()):
                log.info("retuning model %s version %d on its traffic: %s", entry.name, number, why)
            traffic = {number: entry.versions[number].traffic.profile() for number in reasons}
            await self._registry.retune(entry.name, {n: p for n, p in traffic.items() if p is not None})
            retuned.append(entry.name)
        return retuned
