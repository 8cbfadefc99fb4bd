"""The metrics lifecycle: a tick every interval turns counters into samples for the writer thread,
samples the system, and keeps the newest system sample for /metrics.

History is kept only where the state dir allows: read-only, or a database that cannot be opened, turns
history off (recorded as a state-dir problem) while /metrics and inference go on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from appliance.engine.model import ModelVersion
from appliance.engine.server_wide import ServerWide
from appliance.metrics.custom import CustomMetrics
from appliance.metrics.prometheus import TritonCollector, render
from appliance.metrics.samples import Snapshotter
from appliance.metrics.store import MetricsStore, Retention, SchemaTooNew
from appliance.metrics.system import SystemSampler
from appliance.runtime.state import StateDir

__all__ = ["MetricsService", "tick_stamp"]

log = logging.getLogger(__name__)


def tick_stamp(now: float, interval: float, last: int | None) -> int:
    """The stamp of a tick's samples: the interval boundary ``now`` lies in, always past ``last``. A tick
    woken a hair before its boundary (the loop's timers keep milliseconds, and its clock is not the wall
    clock) would otherwise stamp the boundary the tick before it stamped, and its samples would replace
    that tick's rows in the history: traffic lost (seen as 31 of 32 requests in the metrics e2e test)."""
    t = int(now // interval * interval)
    if last is not None and t <= last:
        return last + max(1, round(interval))
    return t


class MetricsService:
    def __init__(self, path: Path, retention: Retention, interval: float,
                 models: Callable[[], list[ModelVersion]], state: StateDir,
                 custom: CustomMetrics | None = None, arenas: Callable[[], dict[str, int]] | None = None,
                 server: ServerWide | None = None,
                 residency: Callable[[], dict[str, Any] | None] | None = None) -> None:
        """``custom``: metric families models define (Python models' pb_utils.MetricFamily), exported
        after the server's own; ``arenas``: measures the Python backend's shared-memory arenas, bytes
        by model (blocking, called off the event loop each tick). ``server``: the response cache and rate
        limiter, whose figures /metrics shows. ``residency``: what each loaded model holds, loads and unloads by
        cause (None: residency off; appliance.repository.residency)."""
        self.path = path
        self._retention = retention
        self._interval = interval
        self._models = models
        self._state = state
        self._custom = custom
        self._store: MetricsStore | None = None
        """None: no history (read-only state dir, or a database that cannot be opened)."""
        self._snapshots = Snapshotter()
        self._last_t: int | None = None
        """The stamp of the last tick's samples."""
        self._sampler: SystemSampler | None = None
        self._task: asyncio.Task | None = None
        self.latest_system: dict[str, Any] | None = None
        self._arenas = arenas
        self.latest_arenas: dict[str, int] | None = None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(TritonCollector(models, lambda: self.latest_system, lambda: self.latest_arenas,
                                                server, residency or (lambda: None)))

    async def start(self) -> None:
        self._sampler = await asyncio.to_thread(SystemSampler)
        self._store = await asyncio.to_thread(self._open_store)
        if self._store is not None:
            self._store.start()
        self._task = asyncio.create_task(self._run(), name="metrics-tick")

    def _open_store(self) -> MetricsStore | None:
        if not self._state.writable:
            return None  # the read_only problem already says that history is off
        try:
            store = MetricsStore(self.path, self._retention, on_read_only=self._state.lost_write_access)
        except (sqlite3.Error, OSError, SchemaTooNew) as exc:
            self._state.note(
                "metrics_db_unusable",
                f"the metrics database {self.path} cannot be opened ({exc}): metrics history is off; /metrics "
                f"and inference are served",
                f"fix or move {self.path} aside (a newer daemon's database: upgrade again, or move it aside) "
                f"and restart the daemon",
            )
            return None
        if store.recovery is not None:
            moved, reason = store.recovery.moved_to, store.recovery.reason
            self._state.note(
                "metrics_db_corrupt",
                f"the metrics database {self.path} was corrupt ({reason}): moved aside to {moved} (with its "
                f"-wal/-shm) and a fresh one started; the earlier history is in that file",
                f"nothing is needed to keep serving; inspect or delete {moved}; if it happens again, check the "
                f"storage (unclean power-off, a failing SD card: `dmesg`)",
            )
            store.put_event("metrics_db_recovered", detail={"moved_to": str(moved), "reason": reason})
        return store

    def event(self, kind: str, model: str | None = None, version: int | None = None,
              detail: dict[str, Any] | None = None) -> None:
        if self._store is not None:
            self._store.put_event(kind, model, version, detail)

    async def _run(self) -> None:
        while True:
            # Sleep to the next interval boundary: samples then line up on whole seconds.
            await asyncio.sleep(self._interval - time.time() % self._interval)
            await self.tick()

    async def tick(self) -> None:
        t = self._last_t = tick_stamp(time.time(), self._interval, self._last_t)
        try:
            if self._store is not None:
                versions = [(m.name, m.version, m.stats) for m in self._models()]
                self._store.put_samples(self._snapshots.take(t, versions))
            assert self._sampler is not None
            system = await asyncio.to_thread(self._sampler.sample)
            system["t"] = t
            self.latest_system = system
            if self._arenas is not None:
                self.latest_arenas = await asyncio.to_thread(self._arenas)
            if self._store is not None:
                self._store.put_system(system)
        except Exception:
            log.exception("metrics tick failed")

    def prometheus(self) -> bytes:
        text = render(self._registry)
        return text + self._custom.exposition().encode() if self._custom is not None else text

    async def stop(self) -> None:
        """Take a last sample, write everything queued, close the database."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.tick()
        if self._store is not None:
            await asyncio.to_thread(self._store.stop)
        if self._sampler is not None:
            self._sampler.close()
