"""The history API's series, read from a metrics database a real store wrote."""

from __future__ import annotations

import time

import pytest

from appliance.core.errors import Unavailable
from appliance.engine.stats import LATENCY_BUCKETS_US
from appliance.metrics.history import history, percentile_ms
from appliance.metrics.samples import ModelSample

NOW = int(time.time()) // 60 * 60 + 30  # mid-minute: a step of 60 puts every sample in one bucket


def _sample(t: int, model: str = "m", version: int = 1, requests: int = 2, queue_ns: int = 4_000_000) -> ModelSample:
    hist = [0] * (len(LATENCY_BUCKETS_US) + 1)
    hist[3] = requests  # 500 us .. 1 ms
    return ModelSample(t, model, version, requests=requests, success=requests, inferences=requests * 4,
                       executions=requests, queue_ns=queue_ns, infer_ns=requests * 2_000_000, latency_hist=hist)


def _system(t: int, cpu: float, gpus: list | None = None) -> dict:
    return {"t": t, "cpu_percent": cpu, "load1": 0.5, "memory_total": 100, "memory_used": 40,
            "memory_percent": 40.0, "rss_bytes": 7, "temperatures": {}, "gpus": gpus or []}


def test_percentiles_interpolate_inside_their_bucket():
    assert percentile_ms([], 0.5) is None and percentile_ms([0, 0], 0.5) is None
    assert percentile_ms([2], 0.5) == 0.05  # half of the 0..100 us bucket
    assert percentile_ms([0, 4], 0.75) == 0.2125  # 100 + 150 * 3/4 us
    assert percentile_ms([0, 0, 5], 0.5) == 0.375 and percentile_ms([0, 0, 5], 1.0) == 0.5
    overflow = [0] * len(LATENCY_BUCKETS_US) + [1]
    assert percentile_ms(overflow, 0.99) == LATENCY_BUCKETS_US[-1] / 1000  # above the last bound: the bound


def test_a_missing_database_has_empty_series(tmp_path):
    result = history(tmp_path / "none.db", NOW - 10, NOW, 1, model="m")
    assert result["series"] == {"t": []} and result["events"] == [] and result["model"] == "m"


def test_bad_ranges_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'until' must be after 'since'"):
        history(tmp_path / "m.db", NOW, NOW, 1)
    with pytest.raises(ValueError, match="raise 'step'"):
        history(tmp_path / "m.db", NOW - 100_000, NOW, 1)


def test_model_series_per_bucket_filtered_by_model_and_version(make_store, tmp_path):
    store = make_store()
    store.start()
    store.put_samples([_sample(NOW - 3), _sample(NOW - 3, version=2, requests=6), _sample(NOW - 1, model="other")])
    store.stop()
    path = tmp_path / "metrics.db"
    series = history(path, NOW - 4, NOW, 1, model="m", version=1)["series"]
    assert series["t"] == [NOW - 4, NOW - 3, NOW - 2, NOW - 1]
    assert series["requests"] == [None, 2, None, None]
    index = 1
    assert series["throughput"][index] == 2.0 and series["batch_size"][index] == 4.0
    assert series["queue_ms"][index] == 2.0 and series["compute_ms"][index] == 2.0
    assert 0.5 < series["p50_ms"][index] <= series["p99_ms"][index] <= 1.0
    both_versions = history(path, NOW - 4, NOW, 1, model="m")["series"]
    assert both_versions["requests"][index] == 8
    every_model = history(path, NOW - 4, NOW, 1)["series"]
    assert sum(r for r in every_model["requests"] if r) == 10
    five_seconds = history(path, NOW - 5, NOW, 5, model="m")["series"]
    assert five_seconds["t"] == [NOW - 5] and five_seconds["requests"] == [8]
    assert five_seconds["throughput"] == [1.6]


def test_a_coarse_step_reads_the_rows_not_rolled_up_yet(make_store, tmp_path):
    store = make_store()
    store.start()
    store.put_samples([_sample(NOW - 20), _sample(NOW - 10)])
    store.stop()
    series = history(tmp_path / "metrics.db", NOW - 30, NOW + 30, 60)["series"]
    assert series["t"] == [NOW - 30] and series["requests"] == [4]


def test_system_series_average_a_bucket_and_show_the_first_gpu(make_store, tmp_path):
    store = make_store()
    store.start()
    gpu = {"index": 0, "utilization_percent": 30, "memory_used": 1, "memory_total": 4}
    store.put_system(_system(NOW - 30, 10.0))
    store.put_system(_system(NOW - 20, 30.0, [gpu]))
    store.stop()
    system = history(tmp_path / "metrics.db", NOW - 30, NOW + 30, 60)["system"]
    assert system["cpu_percent"] == [20.0] and system["rss_bytes"] == [7]
    assert system["gpu_util_percent"] == [30] and system["gpu_memory_percent"] == [25.0]


def test_events_of_other_models_are_left_out(make_store, tmp_path):
    store = make_store()
    store.start()
    store.put_event("model_loaded", "m", 1, {"platform": "onnxruntime_onnx"})
    store.put_event("model_loaded", "other", 1)
    store.put_event("hardware", detail={"fingerprint": "f"})
    store.stop()
    now = int(time.time())
    events = history(tmp_path / "metrics.db", now - 60, now + 60, 60, model="m")["events"]
    assert [(e["kind"], e["model"]) for e in events] == [("model_loaded", "m"), ("hardware", None)]
    assert events[0]["detail"] == {"platform": "onnxruntime_onnx"}


def test_an_unreadable_database_is_unavailable_not_a_crash(tmp_path):
    path = tmp_path / "metrics.db"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(Unavailable, match="cannot be read"):
        history(path, NOW - 10, NOW, 1)
