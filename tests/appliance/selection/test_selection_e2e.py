"""Measured selection through the daemon: /selection, warm restarts from the cache, invalidation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as triton

from tests.builders import cnn_model, save
from tests.http_util import call
from tests.waiting import wait_until

BUDGET = ("--retune",)


def _selection(daemon, model="cnn"):
    status, _, payload = call(daemon.port, "GET", f"/v2/models/{model}/selection")
    assert status == 200, payload
    return payload


def _infer_ok(daemon):
    with triton.InferenceServerClient(daemon.url) as client:
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        tensor = triton.InferInput("image", [1, 3, 16, 16], "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("cnn", [tensor]).as_numpy("logits").shape == (1, 5)


def test_selection_is_cached_and_invalidated(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    model_file = save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    state = tmp_path / "state"
    env = {"APPLIANCE_TUNE_BUDGET": "0.05"}

    cold = start_daemon(repo, selection=True, state=state, env=env)
    first = _selection(cold)
    assert first["cache"] == "miss"
    ok = [c for c in first["candidates"] if c["status"] == "ok"]
    assert len(ok) >= 2 and first["chosen"] == min(ok, key=lambda c: c["latency_ms"])["plan"]
    assert set(first) >= {"chosen", "objective", "cache", "hardware_fingerprint", "candidates"}
    assert set(ok[0]) >= {"plan", "status", "latency_ms", "throughput", "max_abs_error", "reason"}
    _infer_ok(cold)
    explained = subprocess.run([sys.executable, "-m", "appliance", "explain", "cnn", "--url", cold.base],
                               capture_output=True, text=True, check=True).stdout
    assert f"* {first['chosen']}" in explained and "cache miss" in explained
    cold.stop()

    warm = start_daemon(repo, selection=True, state=state, env=env)
    second = _selection(warm)
    assert second["cache"] == "hit"
    assert second["tuned_at"] == first["tuned_at"]  # nothing was timed again
    assert "tuning cnn" not in warm.log()
    _infer_ok(warm)
    warm.stop()

    # An artefact of the entry is damaged: detected, discarded, measured again.
    entries = [p for p in (state / "cache").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(entries) == 1
    damaged = next(p for p in entries[0].rglob("*") if p.is_file() and p.name not in ("manifest.json", ".last_used"))
    damaged.write_bytes(damaged.read_bytes()[: max(1, damaged.stat().st_size // 2)])
    rebuilt = start_daemon(repo, selection=True, state=state, env=env)
    assert _selection(rebuilt)["cache"] == "miss"
    _infer_ok(rebuilt)
    rebuilt.stop()

    # A changed model file is a new key: a miss, never a stale hit.
    save(cnn_model(seed=1), model_file)
    changed = start_daemon(repo, selection=True, state=state, env=env)
    assert _selection(changed)["cache"] == "miss"
    _infer_ok(changed)


def test_retune_flag_measures_again(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    state = tmp_path / "state"
    env = {"APPLIANCE_TUNE_BUDGET": "0.05"}
    start_daemon(repo, selection=True, state=state, env=env).stop()
    again = start_daemon(repo, *BUDGET, selection=True, state=state, env=env)
    assert _selection(again)["cache"] == "miss"


def test_selection_off_is_reported(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    daemon = start_daemon(repo)
    assert _selection(daemon)["cache"] == "off"


def test_daemon_serving_onnx_holds_neither_torch_nor_openvino(start_daemon, tmp_path):
    """Probing and measuring candidates (OpenVINO among them) happen in child processes."""
    repo = tmp_path / "repo"
    save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    daemon = start_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    decision = _selection(daemon)
    assert decision["cache"] == "miss" and len([c for c in decision["candidates"] if c["status"] == "ok"]) >= 2
    if decision["chosen"].startswith("onnxruntime"):
        maps = Path(f"/proc/{daemon.process.pid}/maps").read_text()
        assert "libtorch" not in maps and "libopenvino" not in maps


def test_tuning_progress_is_logged_while_it_runs(start_daemon, tmp_path):
    """Each candidate's result reaches the daemon's log while the model is still tuning (LOADING)."""
    repo = tmp_path / "repo"
    save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    daemon = start_daemon(repo, selection=True, wait_loaded=False, env={"APPLIANCE_TUNE_BUDGET": "0.5"})
    try:
        wait_until(lambda: "items/s with every instance busy" in daemon.log(), timeout=60, interval=0.05,
                   what="a candidate's result in the log")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{daemon.log()}") from None
    index = {row["name"]: row for row in call(daemon.port, "POST", "/v2/repository/index", {})[2]}
    assert index["cnn"]["state"] == "LOADING"
    assert re.search(r"tuning cnn \[1/\d+\]: onnxruntime:CPU@\S+: [\d.]+ ms", daemon.log())
    counts = [(int(step), int(steps)) for step, steps in re.findall(r"tuning cnn \[(\d+)/(\d+)\]", daemon.log())]
    assert counts and all(step <= steps for step, steps in counts), counts  # never "3/2"
