"""A damaged or read-only state dir degrades the daemon and never stops it: a real daemon started as users
start it, against a corrupt metrics database, a read-only mount (tests.readonly) and broken cache entries.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from appliance.examples import mlp_model
from model_cache import ModelCache
from tests.builders import save
from tests.http_util import call
from tests.readonly import read_only_prefix
from tests.waiting import wait_until

TUNE = {"APPLIANCE_TUNE_BUDGET": "0.05"}
SIMPLE = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                     {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
MLP = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.5] * 784}]}


def _mlp_repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    save(mlp_model(), repo / "mlp" / "1" / "model.onnx")
    return repo


def _health(daemon) -> dict:
    status, _, payload = call(daemon.port, "GET", "/v2/health")
    assert status == 200, payload
    return payload


def _kinds(health: dict) -> list[str]:
    return [p["kind"] for p in health["state"]["problems"]]


def _states(daemon) -> dict[str, str]:
    status, _, index = call(daemon.port, "POST", "/v2/repository/index", {})
    assert status == 200, index
    return {row["name"]: row["state"] for row in index}


def _infer_simple(daemon) -> None:
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", SIMPLE)
    assert status == 200, payload
    outputs = {o["name"]: o["data"] for o in payload["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
    assert outputs["OUTPUT1"] == [i - 1 for i in range(16)]


def _infer_mlp(daemon) -> None:
    status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", MLP)
    assert status == 200, payload
    assert abs(sum(payload["outputs"][0]["data"]) - 1.0) < 1e-4  # softmax probabilities


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under the state dir with its size and mtime, but the daemons' logs."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and p.suffix != ".log"}


def _appliance(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=120)


def test_a_corrupt_metrics_db_is_moved_aside_and_the_daemon_serves(start_daemon, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    garbage = bytes(range(256)) * 40
    (state / "metrics.db").write_bytes(garbage)
    (state / "metrics.db-wal").write_bytes(b"half a frame")

    daemon = start_daemon(_mlp_repository(tmp_path), state=state)
    _infer_mlp(daemon)

    moved = [p for p in state.glob("metrics.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(moved) == 1 and moved[0].read_bytes() == garbage
    assert Path(f"{moved[0]}-wal").read_bytes() == b"half a frame"
    health = _health(daemon)
    assert health["live"] and health["ready"] and health["state"]["writable"] is True
    assert _kinds(health) == ["metrics_db_corrupt"]
    assert moved[0].name in health["state"]["problems"][0]["message"]
    assert "was corrupt" in daemon.log() and "To fix:" in daemon.log()

    # The fresh database records: the recovery is an event in the history, next to the traffic.
    def recorded() -> dict | None:
        now = int(time.time()) + 1
        status, _, history = call(daemon.port, "GET", f"/v2/history?since={now - 120}&until={now}&step=1")
        assert status == 200, history
        written = ("metrics_db_recovered" in {e["kind"] for e in history["events"]}
                   and sum(r for r in history["series"]["requests"] if r) >= 1)
        return history if written else None

    history = wait_until(recorded, timeout=20, what="the recovery and the request in the history")
    assert sum(r for r in history["series"]["requests"] if r) == 1


def test_a_read_only_state_dir_serves_from_the_cache_token_and_examples_it_holds(start_daemon, tmp_path):
    state = tmp_path / "state"
    # A first run fills the state dir: the example repository, the token, measured plans, history.
    first = start_daemon(None, state=state, selection=True, env=TUNE)
    assert set(_states(first).values()) == {"READY"}
    _infer_simple(first)
    first.stop()
    token = (state / "auth-token").read_text()
    before = _files(state)
    assert any(name.startswith("cache/") for name in before)

    # The filesystem comes back read-only (as edge boxes remount after errors).
    daemon = start_daemon(None, state=state, selection=True, env=TUNE, prefix=read_only_prefix(state))
    assert _states(daemon) == {"mlp": "READY", "simple": "READY", "simple_string": "READY"}
    _infer_simple(daemon)
    _infer_mlp(daemon)
    status, _, selection = call(daemon.port, "GET", "/v2/models/mlp/selection")
    assert status == 200 and selection["cache"] == "hit", selection

    health = _health(daemon)
    assert health["live"] is True and health["ready"] is True
    assert health["state"]["path"] == str(state) and health["state"]["writable"] is False
    assert "Read-only file system" in health["state"]["reason"]
    assert _kinds(health) == ["read_only"]  # the token, the examples and the cache were all readable
    assert "make " in health["state"]["problems"][0]["fix"]
    log = daemon.log()
    assert "is not writable: Read-only file system" in log and "To fix:" in log
    assert "running with a degraded state dir" in log and "Traceback" not in log

    # Metrics: /metrics served; the history recorded before the remount is still readable.
    status, _, body = call(daemon.port, "GET", "/metrics")
    assert status == 200 and b"nv_inference_request_success" in body
    now = int(time.time()) + 1
    status, _, history = call(daemon.port, "GET", f"/v2/history?since={now - 3600}&until={now}&step=60")
    assert status == 200, history
    assert "daemon_start" in {e["kind"] for e in history["events"]}
    daemon.stop()
    assert _files(state) == before  # nothing written, not even a cache entry's .last_used
    assert (state / "auth-token").read_text() == token


def test_a_read_only_empty_state_dir_still_serves(start_daemon, tmp_path):
    """Nothing to read either: the token lives in memory, the example repository in a temporary
    directory, measured plans are served without being cached."""
    state = tmp_path / "state"
    state.mkdir()
    daemon = start_daemon(None, state=state, selection=True, env=TUNE, prefix=read_only_prefix(state))
    assert set(_states(daemon).values()) == {"READY"}
    _infer_simple(daemon)
    status, _, selection = call(daemon.port, "GET", "/v2/models/mlp/selection")
    assert status == 200 and selection["cache"] == "miss" and selection["candidates"], selection

    health = _health(daemon)
    assert health["state"]["writable"] is False
    kinds = _kinds(health)
    assert {"read_only", "token_not_saved", "example_repository_temporary", "cache_not_saved"} <= set(kinds)
    assert set(kinds) <= {"read_only", "token_not_saved", "example_repository_temporary", "cache_not_saved",
                          "device_id_not_saved"}  # the box id signed requests are bound to: one per run
    examples = next(p["message"] for p in health["state"]["problems"] if p["kind"] == "example_repository_temporary")
    scratch = Path(re.search(r"generated in (\S+) for this run", examples).group(1))
    assert scratch.is_dir()
    status, _, history = call(daemon.port, "GET", "/v2/history")
    assert status == 200 and history["series"] == {"t": []}  # no history, and no error
    daemon.stop()
    assert [p.name for p in state.iterdir() if p.suffix != ".log"] == []
    assert not scratch.exists()  # removed at stop


def test_cache_entries_of_the_wrong_shape_are_misses_and_the_cache_tools_handle_them(start_daemon, tmp_path):
    state = tmp_path / "state"
    repo = _mlp_repository(tmp_path)
    start_daemon(repo, state=state, selection=True, env=TUNE).stop()
    cache = state / "cache"
    (entry,) = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    (entry / "manifest.json").write_text(json.dumps(["valid JSON", "wrong shape"]))
    stray = cache / "0123456789abcdef0123456789abcdef"
    (stray / "artefacts").mkdir(parents=True)
    (stray / "manifest.json").write_text(json.dumps({"files": 42, "size": "big"}))

    listed = _appliance("cache", "ls", "--state-dir", str(state))
    assert listed.returncode == 0, listed.stderr
    assert "0 entries" in listed.stdout and "2 corrupt" in listed.stdout
    assert f"{entry.name}  corrupt: manifest.json holds a JSON list" in listed.stdout

    daemon = start_daemon(repo, state=state, selection=True, env=TUNE)
    assert _states(daemon) == {"mlp": "READY"}
    _infer_mlp(daemon)
    status, _, selection = call(daemon.port, "GET", "/v2/models/mlp/selection")
    assert status == 200 and selection["cache"] == "miss", selection  # measured again, stored again
    health = _health(daemon)
    assert health["state"]["writable"] is True
    assert set(_kinds(health)) == {"cache_entry_unreadable"}
    daemon.stop()
    # The new decision replaced the broken entry; eviction removed the stray one.
    assert ModelCache(cache).broken() == [] and len(ModelCache(cache).entries()) == 1

    (stray / "artefacts").mkdir(parents=True)
    (stray / "manifest.json").write_text("[]")
    cleared = _appliance("cache", "clear", "--state-dir", str(state))
    assert cleared.returncode == 0, cleared.stderr
    assert "removed 2 entries" in cleared.stdout
    assert [p for p in cache.iterdir() if not p.name.startswith(".")] == []
