"""The metrics database on its own: roll-ups, retention, migrations, and surviving kill -9."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance.metrics.history import history
from appliance.metrics.samples import ModelSample
from appliance.metrics.store import SCHEMA_VERSION, MetricsStore, Retention, SchemaTooNew, connect, migrate
from tests.waiting import wait_until


def _sample(t: int, requests: int = 2, model: str = "m") -> ModelSample:
    hist = [0] * 17
    hist[2] = requests
    return ModelSample(t, model, 1, requests=requests, success=requests, inferences=requests * 2,
                       executions=requests, latency_hist=hist, batch_hist={"2": requests})


def _system(t: int) -> dict:
    return {"t": t, "cpu_percent": 10.0, "load1": 0.5, "memory_total": 100, "memory_used": 40,
            "memory_percent": 40.0, "rss_bytes": 7, "temperatures": {}, "gpus": []}


def test_rows_roll_up_to_minutes_and_old_rows_expire(tmp_path, make_store):
    now = int(time.time())
    minute = now // 60 * 60
    store = make_store(tmp_path / "m.db", retention=Retention(raw_seconds=600))
    store.start()
    old = minute - 3600  # older than the raw retention
    store.put_samples([_sample(old), _sample(minute - 120), _sample(minute - 119), _sample(minute - 61)])
    store.put_system(_system(minute - 120))
    store.stop()
    db = sqlite3.connect(tmp_path / "m.db")
    raw = [t for (t,) in db.execute("SELECT t FROM model_1s ORDER BY t")]
    assert old not in raw and minute - 120 in raw  # retention removed only the old raw row
    minutes = dict(db.execute("SELECT t, requests FROM model_1m"))
    assert minutes[minute - 120] == 6  # three one-second samples of that minute, merged
    assert minutes[old // 60 * 60] == 2  # rolled up before the raw row expired
    assert db.execute("SELECT COUNT(*) FROM system_1m").fetchone()[0] == 1


def test_schema_is_versioned_and_migrated(tmp_path):
    path = tmp_path / "m.db"
    db = connect(path)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (0)")
    assert migrate(db) == SCHEMA_VERSION
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"model_1s", "model_1m", "model_1h", "system_1s", "events"} <= tables
    assert db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    assert migrate(db) == SCHEMA_VERSION  # idempotent


def test_size_cap_drops_the_oldest_raw_rows(tmp_path, make_store):
    now = int(time.time())
    store = make_store(tmp_path / "m.db", retention=Retention(max_bytes=64 * 1024))
    store.start()
    store.put_samples([_sample(now - 3000 + i, model=f"model-{i % 7}") for i in range(2000)])
    store.stop()
    db = sqlite3.connect(tmp_path / "m.db")
    remaining = db.execute("SELECT MIN(t), COUNT(*) FROM model_1s").fetchone()
    assert remaining[1] < 2000 and remaining[0] > now - 3000


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from appliance.metrics.samples import ModelSample
    from appliance.metrics.store import MetricsStore
    store = MetricsStore(Path(sys.argv[1]))
    store.start()
    t = int(time.time())
    print("started", flush=True)
    i = 0
    while True:
        i += 1
        store.put_samples([ModelSample(t + i, f"m{j}", 1, requests=1, success=1, latency_hist=[1] + [0] * 16)
                           for j in range(50)])
        store.put_event("tick", detail={"i": i})
        time.sleep(0.002)
""")


def test_kill_9_mid_write_leaves_an_intact_database(tmp_path):
    path = tmp_path / "m.db"
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout.readline().strip() == "started"
            # writing in earnest (its write-ahead log past a few hundred KiB) when it is killed
            wal = path.with_name(path.name + "-wal")
            wait_until(lambda: wal.exists() and wal.stat().st_size > 256 * 1024, timeout=30,
                       what="the writer's log growing")
        finally:
            process.send_signal(signal.SIGKILL)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.execute("SELECT COUNT(*) FROM model_1s").fetchone()[0]
    events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert rows > 0 and events > 0
    assert rows % 50 == 0  # whole batches only: no half-written insert survived


def _filled(make_store, path) -> None:
    now = int(time.time())
    store = make_store(path)
    store.start()
    store.put_samples([_sample(now - 600 + i, model=f"model-{i % 5}") for i in range(600)])
    store.put_event("before")
    store.stop()


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CORRUPTIONS = {
    "random bytes": lambda path: path.write_bytes(bytes(range(256)) * 64),
    "truncated": _truncate,
    "a text file": lambda path: path.write_text("not a database\n"),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_database_is_moved_aside_and_a_fresh_one_started(tmp_path, corrupt, make_store):
    path = tmp_path / "metrics.db"
    _filled(make_store, path)
    corrupt(path)
    damaged = path.read_bytes()
    Path(f"{path}-wal").write_bytes(b"stale wal")
    store = make_store(path)
    assert store.recovery is not None and store.recovery.reason
    moved = store.recovery.moved_to
    assert moved.parent == tmp_path and moved.name.startswith("metrics.db.corrupt-")
    assert moved.read_bytes() == damaged  # kept as it was, for a person to look at
    assert Path(f"{moved}-wal").read_bytes() == b"stale wal"  # its WAL went along
    store.start()
    store.put_samples([_sample(int(time.time()) - 2)])
    store.stop()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT COUNT(*) FROM model_1s").fetchone()[0] == 1


def test_a_sound_database_is_opened_as_it_is(tmp_path, make_store):
    path = tmp_path / "metrics.db"
    _filled(make_store, path)
    store = make_store(path)
    assert store.recovery is None
    store.start()
    store.stop()
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM model_1s").fetchone()[0] == 600


def test_a_newer_schema_is_left_alone(tmp_path):
    path = tmp_path / "metrics.db"
    db = connect(path)
    migrate(db)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.close()
    with pytest.raises(SchemaTooNew):
        MetricsStore(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


def test_immutable_history_reads_create_no_files(tmp_path, make_store):
    """A WAL database needs a -shm file to be read, which a read-only directory cannot get; ``immutable``
    reads without one (the end-to-end test reads through a real read-only mount)."""
    path = tmp_path / "metrics.db"
    _filled(make_store, path)
    before = sorted(p.name for p in tmp_path.iterdir())
    now = int(time.time())
    result = history(path, now - 700, now + 2, 60, immutable=True)
    assert sum(r for r in result["series"]["requests"] if r) == 1200
    assert [e["kind"] for e in result["events"]] == ["before"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before



def test_a_store_that_stops_taking_writes_stops_history_once(tmp_path, caplog, make_store):
    """Edge filesystems remount read-only after errors, while the daemon runs: the writer says so once
    and drops rows, instead of failing (with a traceback) every cycle. The kernel refuses to remount a
    directory with a file open for writing in a test, so SQLite's own read-only answer stands in."""
    told: list[str] = []
    store = make_store(tmp_path / "metrics.db", on_read_only=told.append)
    store._db.execute("PRAGMA query_only = ON")  # noqa: SLF001 - SQLITE_READONLY, as a ro remount gives
    store.start()
    store.put_event("after")
    wait_until(lambda: told, timeout=30, what="the writer to find the file read-only")
    for _ in range(4):  # the cycles after: their rows dropped without a word
        store.put_event("after")
    store.stop()
    assert len(told) == 1 and "readonly" in told[0]
    assert [r.getMessage() for r in caplog.records].count(
        f"metrics history stopped: {tmp_path / 'metrics.db'} cannot be written ({told[0]})") == 1
    assert not any(r.exc_info for r in caplog.records)
