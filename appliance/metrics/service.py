"""The metrics lifecycle: a tick every interval turns counters into samples for the writer thread,
samples the system, and keeps the newest system sample for /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from appliance.core.model import ModelVersion
from appliance.metrics.prometheus import TritonCollector, render
from appliance.metrics.samples import Snapshotter
from appliance.metrics.store import MetricsStore, Retention
from appliance.metrics.system import SystemSampler

__all__ = ["MetricsService"]

log = logging.getLogger(__name__)


class MetricsService:
    def __init__(self, path: Path, retention: Retention, interval: float,
                 models: Callable[[], list[ModelVersion]]) -> None:
        self.path = path
        self._interval = interval
        self._models = models
        self._store = MetricsStore(path, retention)
        self._snapshots = Snapshotter()
        self._sampler: SystemSampler | None = None
        self._task: asyncio.Task | None = None
        self.latest_system: dict[str, Any] | None = None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(TritonCollector(models, lambda: self.latest_system))

    async def start(self) -> None:
        self._sampler = await asyncio.to_thread(SystemSampler)
        self._store.start()
        self._task = asyncio.create_task(self._run(), name="metrics-tick")

    def event(self, kind: str, model: str | None = None, version: int | None = None,
              detail: dict[str, Any] | None = None) -> None:
        self._store.put_event(kind, model, version, detail)

    async def _run(self) -> None:
        while True:
            # Sleep to the next interval boundary: samples then line up on whole seconds.
            await asyncio.sleep(self._interval - time.time() % self._interval)
            await self.tick()

    async def tick(self) -> None:
        t = int(time.time() // self._interval * self._interval)
        try:
            versions = [(m.name, m.version, m.stats) for m in self._models()]
            self._store.put_samples(self._snapshots.take(t, versions))
            assert self._sampler is not None
            system = await asyncio.to_thread(self._sampler.sample)
            system["t"] = t
            self.latest_system = system
            self._store.put_system(system)
        except Exception:
            log.exception("metrics tick failed")

    def prometheus(self) -> bytes:
        return render(self._registry)

    async def stop(self) -> None:
        """Take a last sample, write everything queued, close the database."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.tick()
        await asyncio.to_thread(self._store.stop)
        if self._sampler is not None:
            self._sampler.close()
