"""The /metrics exposition: Triton's names (no _total), labels and histograms, from the daemon's counters."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from appliance.engine.rate_limiter import InstanceNeeds, RateLimitCounts, RateLimiter
from appliance.engine.response_cache import ResponseCache
from appliance.engine.server_wide import ServerWide
from appliance.engine.stats import LATENCY_BUCKETS_US, BatchTiming, FailureReason, ModelStats, SequenceCounts
from appliance.metrics.prometheus import TritonCollector, render


def _version(name: str, version: int, pending: int = 0) -> SimpleNamespace:
    """What the collector reads of a served model version: its name, number, counters and queue."""
    stats = ModelStats()
    stats.record_request(True, 300_000)  # 300 us
    stats.record_request(True, 3_000_000)
    stats.record_request(False, 50_000, FailureReason.REJECTED)
    stats.record_batch(2, 2, [1_000, 3_000], BatchTiming(1_000, 5_000, 2_000))
    return SimpleNamespace(name=name, version=version, stats=stats, scheduler=SimpleNamespace(pending=pending),
                           response_cache=None)


def _scrape(models, system=None, arenas=None, server=None) -> tuple[dict[str, float], str]:
    registry = CollectorRegistry()
    registry.register(TritonCollector(lambda: models, lambda: system, lambda: arenas, server))
    text = render(registry).decode()
    # Triton's users query nv_inference_request_success, not ..._total (memory_total_bytes is a name)
    assert "_total " not in text and "_total{" not in text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}, text


def _key(name: str, **labels: str) -> str:
    """A sample's line prefix (prometheus-client writes the labels sorted)."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_model_counters_under_triton_names_and_labels():
    metrics, text = _scrape([_version("m", 1, pending=3), _version("n", 2)])
    m = {"model": "m", "version": "1"}
    assert metrics[_key("nv_inference_request_success", **m)] == 2
    assert metrics[_key("nv_inference_request_failure", **m, reason="REJECTED")] == 1
    assert metrics[_key("nv_inference_request_failure", **m, reason="BACKEND")] == 0
    assert metrics[_key("nv_inference_count", **m)] == 2 and metrics[_key("nv_inference_exec_count", **m)] == 1
    assert metrics[_key("nv_inference_pending_request_count", **m)] == 3
    assert metrics[_key("nv_inference_request_duration_us", **m)] == 3350  # (300 + 3000 + 50) us
    assert metrics[_key("nv_inference_queue_duration_us", **m)] == 4
    assert metrics[_key("nv_inference_compute_infer_duration_us", **m)] == 10  # 5 us per request, 2 requests
    assert metrics[_key("nv_inference_request_success", model="n", version="2")] == 2
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# HELP nv_inference_count Number of inferences performed (batch items)" in text


def test_latency_histogram_buckets_are_cumulative_seconds():
    metrics, _ = _scrape([_version("m", 1)])
    m = {"model": "m", "version": "1"}

    def bucket(bound: str) -> float:
        return metrics[_key("nv_inference_request_latency_seconds_bucket", **m, le=bound)]

    assert bucket(str(100 / 1e6)) == 1  # the 50 us failure
    assert bucket(str(500 / 1e6)) == 2  # + the 300 us request
    assert bucket(str(5_000 / 1e6)) == 3 and bucket("+Inf") == 3
    assert metrics[_key("nv_inference_request_latency_seconds_count", **m)] == 3
    assert metrics[_key("nv_inference_request_latency_seconds_sum", **m)] == pytest.approx(0.00335)
    assert len([k for k in metrics if k.startswith("nv_inference_request_latency_seconds_bucket")]) == (
        len(LATENCY_BUCKETS_US) + 1)


def test_system_gauges_only_with_a_sample_and_gpu_gauges_only_for_gpus_that_report():
    metrics, _ = _scrape([])
    assert not any(k.startswith(("nv_cpu", "nv_gpu")) for k in metrics)
    system = {"cpu_percent": 25.0, "memory_total": 1000, "memory_used": 400,
              "gpus": [{"index": 0, "utilization_percent": 50, "memory_total": 8, "memory_used": 2,
                        "power_watts": 30.5, "temperature_c": 60}, {"index": 1}]}
    metrics, _ = _scrape([], system)
    assert metrics["nv_cpu_utilization"] == 0.25 and metrics["nv_cpu_memory_used_bytes"] == 400
    assert metrics['nv_gpu_utilization{gpu_uuid="0"}'] == 0.5 and metrics['nv_gpu_power_usage{gpu_uuid="0"}'] == 30.5
    assert not any('gpu_uuid="1"' in k for k in metrics)
    metrics, _ = _scrape([], {**system, "gpus": [{"index": 1}]})
    assert not any(k.startswith("nv_gpu") for k in metrics)


def test_sequence_models_add_the_batchers_counts():
    plain, sequence = _version("plain", 1), _version("seq", 1)
    sequence.stats.sequences = SequenceCounts(active=2, backlog=1, started=5, ended=2, reaped=1)
    metrics, text = _scrape([plain, sequence])
    assert metrics[_key("appliance_sequence_active", model="seq", version="1")] == 2
    assert metrics[_key("appliance_sequence_backlog", model="seq", version="1")] == 1
    assert metrics[_key("appliance_sequence_count", model="seq", version="1", event="reaped")] == 1
    assert metrics[_key("appliance_sequence_count", model="seq", version="1", event="started")] == 5
    assert "# TYPE appliance_sequence_count counter" in text
    assert not any('model="plain"' in line for line in text.splitlines() if "sequence" in line)
    assert "appliance_sequence" not in _scrape([plain])[1]


def test_cached_models_add_tritons_cache_counters_and_the_cache_its_own_gauges():
    cache = ResponseCache(10_000)
    cache.insert(b"k", ResponseCache.owner(), {"y": np.zeros(250, np.float32)})
    cache.lookup(b"k")
    cache.lookup(b"other")
    plain, cached = _version("plain", 1), _version("cached", 1)
    cached.response_cache = cache
    cached.stats.record_cache_hit(4_000)
    cached.stats.record_cache_hit(2_000)
    cached.stats.record_cache_miss(9_000)
    metrics, text = _scrape([plain, cached], server=ServerWide(response_cache=cache))
    m = {"model": "cached", "version": "1"}
    assert metrics[_key("nv_cache_num_hits_per_model", **m)] == 2
    assert metrics[_key("nv_cache_num_misses_per_model", **m)] == 1
    assert metrics[_key("nv_cache_hit_duration_per_model", **m)] == 6  # us
    assert metrics[_key("nv_cache_miss_duration_per_model", **m)] == 9
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    assert not any('model="plain"' in line for line in text.splitlines() if "nv_cache" in line)
    assert metrics["nv_cache_num_entries"] == 1 and metrics["nv_cache_num_hits"] == 1
    assert metrics["nv_cache_num_misses"] == 1 and metrics["nv_cache_num_lookups"] == 2
    assert metrics["nv_cache_util"] == pytest.approx(cache.used / 10_000)
    assert metrics["appliance_response_cache_size_bytes"] == 10_000
    assert metrics["appliance_response_cache_used_bytes"] == cache.used
    assert "nv_cache" not in _scrape([plain])[1]  # no cache configured: no cache metrics at all


def test_the_rate_limiter_shows_its_resources_and_the_waits():
    limiter = RateLimiter()
    counts = RateLimitCounts(waits=3, wait_ns=7_000)
    limiter.register("m:1", [InstanceNeeds(0, (("gpu_slot", False, 2), ("bus", True, 1)))], counts)
    model = _version("m", 1)
    model.stats.rate_limiter = counts
    metrics, text = _scrape([model], server=ServerWide(rate_limiter=limiter))
    assert metrics[_key("appliance_rate_limiter_resource_count", resource="gpu_slot", device="0")] == 2
    assert metrics[_key("appliance_rate_limiter_resource_count", resource="bus", device="global")] == 1
    assert metrics[_key("appliance_rate_limiter_resource_in_use", resource="bus", device="global")] == 0
    assert metrics[_key("appliance_rate_limiter_waits", model="m", version="1")] == 3
    assert metrics[_key("appliance_rate_limiter_wait_duration_us", model="m", version="1")] == 7
    assert "appliance_rate_limiter" not in _scrape([_version("m", 1)])[1]


def test_python_arenas_are_counted_by_model_once_sampled():
    assert "appliance_python_arena_bytes" not in _scrape([])[1]  # not sampled yet (or --no-metrics)
    metrics, text = _scrape([], arenas={"bls": 65536, "echo": 2 << 20})
    assert metrics['appliance_python_arena_bytes{model="bls"}'] == 65536
    assert metrics['appliance_python_arena_bytes{model="echo"}'] == 2 << 20
    assert "# TYPE appliance_python_arena_bytes gauge" in text
