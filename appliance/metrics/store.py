"""The metrics database: one writer thread, WAL, batched inserts, roll-ups, retention, migrations.

Only the writer thread touches the write connection; the event loop hands it work through a queue and
never waits for SQLite. Each cycle commits one transaction, so a crash (even kill -9) loses at most the
cycle in flight and WAL keeps the file intact.

A file damaged anyway (power loss on a card that lies about flushes, a copy cut short) must not keep the
daemon from starting: ``open_database`` checks the file, and moves a corrupt one aside (with its -wal
and -shm) to ``metrics.db.corrupt-<time>`` and starts a fresh one.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import queue
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlite_utils

from appliance.metrics.samples import ModelSample, merge_samples

__all__ = ["MetricsStore", "Recovery", "Retention", "SCHEMA_VERSION", "SchemaTooNew", "open_database"]

log = logging.getLogger(__name__)

_MODEL_COLUMNS = {
    "t": int, "model": str, "version": int, "requests": int, "success": int, "failure": int,
    "failure_reasons": str, "inferences": int, "executions": int, "latency_ns": int, "queue_ns": int,
    "input_ns": int, "infer_ns": int, "output_ns": int, "latency_hist": str, "batch_hist": str,
}
_SYSTEM_COLUMNS = {
    "t": int, "cpu_percent": float, "load1": float, "memory_total": int, "memory_used": int,
    "memory_percent": float, "rss_bytes": int, "temperatures": str, "gpus": str,
}
_RESOLUTIONS = (("1s", 1), ("1m", 60), ("1h", 3600))


def _migration_1(conn: sqlite3.Connection) -> None:
    db = sqlite_utils.Database(conn)
    for suffix, _ in _RESOLUTIONS:
        db.table(f"model_{suffix}").create(_MODEL_COLUMNS, pk=("t", "model", "version"), if_not_exists=True)
        db.table(f"system_{suffix}").create(_SYSTEM_COLUMNS, pk="t", if_not_exists=True)
    db.table("events").create({"id": int, "t": float, "kind": str, "model": str, "version": int, "detail": str},
                        pk="id", not_null={"t", "kind"}, if_not_exists=True)
    db.table("state").create({"key": str, "value": int}, pk="key", if_not_exists=True)


def _migration_2(db: sqlite3.Connection) -> None:
    db.execute("CREATE INDEX IF NOT EXISTS events_t ON events (t)")
    db.execute("CREATE INDEX IF NOT EXISTS model_1s_model ON model_1s (model, t)")


MIGRATIONS = (_migration_1, _migration_2)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclasses.dataclass(frozen=True)
class Retention:
    raw_seconds: int = 24 * 3600
    minute_seconds: int = 7 * 24 * 3600
    hour_seconds: int = 90 * 24 * 3600
    max_bytes: int = 256 * 1024 * 1024


def connect(path: Path, readonly: bool = False, immutable: bool = False) -> sqlite3.Connection:
    """``immutable``: read a database in a read-only directory, where SQLite cannot create the -shm
    file a WAL database needs (nothing writes the file meanwhile: the directory is read-only)."""
    if readonly:
        return sqlite3.connect(f"file:{path}?mode=ro" + ("&immutable=1" if immutable else ""), uri=True,
                               timeout=10, check_same_thread=False)
    db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file only
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class SchemaTooNew(RuntimeError):
    """The database was written by a newer daemon (a downgrade): left alone, not overwritten."""


def migrate(db: sqlite3.Connection) -> int:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = db.execute("SELECT version FROM schema_version").fetchone()
    current = row[0] if row else 0
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(f"metrics database schema {current} is newer than this daemon's {SCHEMA_VERSION}")
    for number in range(current, SCHEMA_VERSION):
        db.execute("BEGIN")
        MIGRATIONS[number](db)
        db.execute("DELETE FROM schema_version")
        db.execute("INSERT INTO schema_version VALUES (?)", (number + 1,))
        db.execute("COMMIT")
    return SCHEMA_VERSION


@dataclasses.dataclass(frozen=True)
class Recovery:
    """A corrupt database moved aside."""

    moved_to: Path
    reason: str


class _Damaged(sqlite3.DatabaseError):
    """PRAGMA quick_check found damage that opening the file did not."""


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    return isinstance(exc, _Damaged) or getattr(exc, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _open_checked(path: Path) -> sqlite3.Connection:
    db = connect(path)
    try:
        # Reads every page (a fraction of a second for the size cap's 256 MiB): a truncated file often
        # opens and migrates fine and breaks only when a query reaches a missing page.
        findings = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
        if findings != ["ok"]:
            raise _Damaged("; ".join(findings))
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{number}")
    # The -wal and -shm files go along, named as SQLite expects: the moved copy opens as it was.
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(f"{target}{suffix}")
    return target


def open_database(path: Path) -> tuple[sqlite3.Connection, Recovery | None]:
    """Open, check and migrate the database (blocking). A corrupt file (not SQLite, truncated, damaged
    pages) is moved aside and a fresh database started: the connection, and the recovery if there was
    one. Other errors (a newer schema, permissions) are raised."""
    try:
        return _open_checked(path), None
    except sqlite3.DatabaseError as exc:
        if not _is_corruption(exc):
            raise
        reason = str(exc)
    moved = _move_aside(path)
    return _open_checked(path), Recovery(moved, reason)


def _is_read_only(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return True
    # SQLITE_READONLY (a file remounted read-only), and SQLITE_IOERR that the remount causes.
    return isinstance(exc, sqlite3.OperationalError) and any(
        words in str(exc) for words in ("readonly database", "disk I/O error"))


class MetricsStore:
    def __init__(self, path: Path, retention: Retention = Retention(),
                 on_read_only: Callable[[str], None] | None = None) -> None:
        """Opens the database (blocking); ``recovery`` says whether a corrupt one was moved aside.
        ``on_read_only`` is told (from the writer thread) when the file stops taking writes; the
        writer then drops what it is given instead of failing every cycle."""
        self.path = path
        self._on_read_only = on_read_only
        self._read_only = False
        self.retention = retention
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db, self.recovery = open_database(path)
        self._tables = sqlite_utils.Database(self._db)

    # -- called from the event loop (never blocks) ---------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def put_samples(self, samples: list[ModelSample]) -> None:
        if samples:
            self._queue.put(("model", [s.row() for s in samples]))

    def put_system(self, row: dict[str, Any]) -> None:
        self._queue.put(("system", row))

    def put_event(self, kind: str, model: str | None = None, version: int | None = None,
                  detail: dict[str, Any] | None = None) -> None:
        self._queue.put(("event", {"t": time.time(), "kind": kind, "model": model, "version": version,
                                   "detail": json.dumps(detail or {}, default=str)}))

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then close (blocking: call off the event loop). Safe to call again, and
        on a store that never started."""
        if self._thread.ident is None:  # never started: nothing was queued, nobody else holds the file
            self._db.close()
            return
        self._queue.put(("stop", None))
        self._thread.join(timeout)

    # -- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        running = True
        while running:
            items = [self._queue.get()]
            while True:  # take everything already queued into this one transaction
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            running = not any(kind == "stop" for kind, _ in items)
            if self._read_only:
                continue
            try:
                self._write(items)
                self._maintain(int(time.time()))
            except Exception as exc:
                if _is_read_only(exc):
                    self._read_only = True
                    log.warning("metrics history stopped: %s cannot be written (%s)", self.path, exc)
                    if self._on_read_only is not None:
                        self._on_read_only(str(exc))
                    continue
                log.exception("metrics writer failed a cycle; its rows are lost, the daemon goes on")
        self._db.close()

    def _write(self, items: list[tuple[str, Any]]) -> None:
        """One batched insert per table, all in one transaction: sqlite-utils commits each chunk of an
        ``insert_all`` on its own (a kill between two would keep part of a cycle) unless it runs inside
        ``atomic()``, where its chunks become savepoints."""
        models = [row for kind, rows in items if kind == "model" for row in rows]
        systems = [{**p, "temperatures": json.dumps(p["temperatures"]), "gpus": json.dumps(p["gpus"])}
                   for kind, p in items if kind == "system"]
        events = [p for kind, p in items if kind == "event"]
        with self._tables.atomic():
            if models:
                self._tables.table("model_1s").insert_all(models, replace=True)
            if systems:
                self._tables.table("system_1s").insert_all(systems, replace=True)
            if events:
                self._tables.table("events").insert_all(events)

    def _maintain(self, now: int) -> None:
        """Roll finished minutes and hours up, then enforce retention (once a minute is enough)."""
        db = self._db
        minute = now // 60 * 60
        done = db.execute("SELECT value FROM state WHERE key = 'maintained'").fetchone()
        if done and done[0] >= minute:
            return
        db.execute("BEGIN")
        for (source, _), (target, bucket) in zip(_RESOLUTIONS, _RESOLUTIONS[1:]):
            self._roll_up(source, target, bucket, now // bucket * bucket)
        self._expire(now)
        db.execute("INSERT OR REPLACE INTO state VALUES ('maintained', ?)", (minute,))
        db.execute("COMMIT")
        self._cap_size()

    def _roll_up(self, source: str, target: str, bucket: int, before: int) -> None:
        db = self._db
        key = f"rolled_{target}"
        row = db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        start = row[0] if row else 0
        if start >= before:
            return
        db.row_factory = sqlite3.Row
        rows = db.execute(f"SELECT * FROM model_{source} WHERE t >= ? AND t < ?", (start, before)).fetchall()
        groups: dict[tuple, list[ModelSample]] = defaultdict(list)
        for r in rows:
            sample = ModelSample.from_row(dict(r))
            groups[(sample.t // bucket * bucket, sample.model, sample.version)].append(sample)
        merged = [merge_samples(t, samples).row() for (t, _, _), samples in groups.items()]
        db.executemany(
            f"INSERT OR REPLACE INTO model_{target} VALUES (:t, :model, :version, :requests, :success, :failure, "
            ":failure_reasons, :inferences, :executions, :latency_ns, :queue_ns, :input_ns, :infer_ns, "
            ":output_ns, :latency_hist, :batch_hist)", merged)
        db.execute(
            f"INSERT OR REPLACE INTO system_{target} SELECT (t / {bucket}) * {bucket}, AVG(cpu_percent), AVG(load1), "
            f"MAX(memory_total), AVG(memory_used), AVG(memory_percent), AVG(rss_bytes), MAX(temperatures), MAX(gpus) "
            f"FROM system_{source} WHERE t >= ? AND t < ? GROUP BY t / {bucket}", (start, before))
        db.row_factory = None
        db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, before))

    def _expire(self, now: int) -> None:
        keep = {"1s": self.retention.raw_seconds, "1m": self.retention.minute_seconds,
                "1h": self.retention.hour_seconds}
        for suffix, seconds in keep.items():
            self._db.execute(f"DELETE FROM model_{suffix} WHERE t < ?", (now - seconds,))
            self._db.execute(f"DELETE FROM system_{suffix} WHERE t < ?", (now - seconds,))
        self._db.execute("DELETE FROM events WHERE t < ?", (now - self.retention.hour_seconds,))

    def _cap_size(self) -> None:
        """Over the size cap: drop the oldest raw rows (then minutes) until it fits."""
        db = self._db
        for table in ("model_1s", "system_1s", "model_1m", "system_1m"):
            pages, size = db.execute("PRAGMA page_count").fetchone()[0], db.execute("PRAGMA page_size").fetchone()[0]
            if pages * size <= self.retention.max_bytes:
                return
            oldest, newest = db.execute(f"SELECT MIN(t), MAX(t) FROM {table}").fetchone()
            if oldest is None:
                continue
            cut = oldest + max(1, (newest - oldest) // 2)
            db.execute(f"DELETE FROM {table} WHERE t < ?", (cut,))
            db.execute("PRAGMA incremental_vacuum")
