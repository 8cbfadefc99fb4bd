"""Counts agree everywhere: /metrics (Prometheus, Triton's names), /v2/models/stats, the history API
and the SQLite file, for requests sent through tritonclient."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from appliance.examples import build_example_repository, mlp_model
from tests.builders import write_model
from tests.http_util import call
from tests.waiting import wait_until

SUCCESSES = 40
FAILURES = 5


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    write_model(repo, "batched", mlp_model(seed=2),
                config="max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n")
    return repo


@pytest.fixture(scope="module")
def traffic(daemon):
    strings = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    bad = np.array([[b"not a number"] * 16], dtype=object)
    with triton.InferenceServerClient(daemon.url) as client:
        for _ in range(SUCCESSES):
            inputs = [triton.InferInput("INPUT0", [1, 16], "BYTES"), triton.InferInput("INPUT1", [1, 16], "BYTES")]
            inputs[0].set_data_from_numpy(strings)
            inputs[1].set_data_from_numpy(strings)
            client.infer("simple_string", inputs)
        for _ in range(FAILURES):  # valid requests the runtime fails: the string is no number
            inputs = [triton.InferInput("INPUT0", [1, 16], "BYTES"), triton.InferInput("INPUT1", [1, 16], "BYTES")]
            inputs[0].set_data_from_numpy(bad)
            inputs[1].set_data_from_numpy(strings)
            with pytest.raises(InferenceServerException):
                client.infer("simple_string", inputs)

    def batched(i):
        with triton.InferenceServerClient(daemon.url) as client:
            tensor = triton.InferInput("input", [1, 784], "FP32")
            tensor.set_data_from_numpy(np.full((1, 784), i, np.float32))
            client.infer("batched", [tensor])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(batched, range(32)))
    wait_until(lambda: _recorded(daemon), timeout=30, what="the traffic in the metrics database", interval=0.1)
    return daemon


def _recorded(daemon) -> bool:
    """Whether the metrics ticks (one a second) have put all of the traffic into the database. A tick stamps
    what the second before it counted with its own second: a history query from now on reaches it."""
    try:
        db = sqlite3.connect(f"file:{daemon.log_path.parent / 'metrics.db'}?mode=ro", uri=True, timeout=5)
    except sqlite3.OperationalError:  # not created yet
        return False
    try:
        strings = db.execute("SELECT SUM(success), SUM(failure) FROM model_1s WHERE model = 'simple_string'")
        batched = db.execute("SELECT SUM(inferences) FROM model_1s WHERE model = 'batched'")
        systems = db.execute("SELECT COUNT(*) FROM system_1s")
        return (strings.fetchone() == (SUCCESSES, FAILURES) and batched.fetchone()[0] == 32
                and systems.fetchone()[0] > 0)
    except sqlite3.OperationalError:  # busy with the daemon's write, or its tables not made yet: look again
        return False
    finally:
        db.close()


def _prometheus(daemon) -> dict[str, float]:
    text = urllib.request.urlopen(daemon.base + "/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def test_prometheus_uses_triton_names_and_counts(traffic):
    metrics = _prometheus(traffic)
    labels = 'model="simple_string",version="1"'
    assert metrics[f"nv_inference_request_success{{{labels}}}"] == SUCCESSES
    assert metrics['nv_inference_request_failure{model="simple_string",reason="BACKEND",version="1"}'] == FAILURES
    assert metrics[f"nv_inference_count{{{labels}}}"] == SUCCESSES
    assert metrics[f"nv_inference_exec_count{{{labels}}}"] == SUCCESSES  # executions that produced results
    assert metrics[f"nv_inference_request_duration_us{{{labels}}}"] > 0
    assert metrics[f'nv_inference_request_latency_seconds_count{{{labels}}}'] == SUCCESSES + FAILURES
    assert f"nv_inference_pending_request_count{{{labels}}}" in metrics
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        key = f"nv_inference_{name}_duration_us{{{labels}}}" if name == "queue" else \
            f"nv_inference_{name}_duration_us{{{labels}}}"
        assert key in metrics
    assert 0 <= metrics["nv_cpu_utilization"] <= 1
    assert metrics["nv_cpu_memory_total_bytes"] > metrics["nv_cpu_memory_used_bytes"] > 0


def test_batching_shows_as_fewer_executions_than_inferences(traffic):
    metrics = _prometheus(traffic)
    labels = 'model="batched",version="1"'
    assert metrics[f"nv_inference_count{{{labels}}}"] == 32
    assert metrics[f"nv_inference_exec_count{{{labels}}}"] < 32


def test_statistics_history_and_sqlite_agree(traffic):
    status, _, stats = call(traffic.port, "GET", "/v2/models/simple_string/stats")
    inference = stats["model_stats"][0]["inference_stats"]
    assert (inference["success"]["count"], inference["fail"]["count"]) == (SUCCESSES, FAILURES)

    now = int(time.time()) + 1
    query = f"model=simple_string&since={now - 600}&until={now}&step=1"
    status, _, history = call(traffic.port, "GET", f"/v2/history?{query}")
    assert status == 200
    series = history["series"]
    assert sum(v for v in series["success"] if v) == SUCCESSES
    assert sum(v for v in series["failure"] if v) == FAILURES
    assert any(v for v in series["p99_ms"] if v)
    kinds = {e["kind"] for e in history["events"]}
    assert "model_loaded" in kinds

    db = sqlite3.connect(traffic.extra.get("state", traffic.log_path.parent) / "metrics.db")
    success, failure = db.execute(
        "SELECT SUM(success), SUM(failure) FROM model_1s WHERE model = 'simple_string'").fetchone()
    assert (success, failure) == (SUCCESSES, FAILURES)
    kinds = {kind for (kind,) in db.execute("SELECT kind FROM events")}
    assert {"daemon_start", "hardware", "model_loaded"} <= kinds
    assert db.execute("SELECT COUNT(*) FROM system_1s").fetchone()[0] > 0


def test_history_rejects_bad_queries(traffic):
    status, _, payload = call(traffic.port, "GET", "/v2/history?since=yesterday")
    assert status == 400 and "since" in payload["error"]
    status, _, payload = call(traffic.port, "GET", "/v2/history?since=0&until=100000000&step=1")
    assert status == 400 and "raise 'step'" in payload["error"]


def test_stats_cli_reads_the_history(traffic):
    result = subprocess.run([sys.executable, "-m", "appliance", "stats", "simple_string", "--since", "10m",
                             "--step", "1m", "--state-dir", str(traffic.log_path.parent)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"{SUCCESSES + FAILURES} requests ({FAILURES} failed)" in result.stdout


def test_separate_metrics_port(start_daemon, tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start_daemon(build_example_repository(tmp_path / "repo"), "--metrics-port", str(port))
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "nv_inference_request_success" in body
    assert "serving Prometheus metrics on" in daemon.log()
