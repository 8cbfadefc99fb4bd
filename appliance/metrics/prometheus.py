"""Prometheus metrics with Triton's names, read at scrape time from the counters the daemon keeps.

A collector on its own registry (never the global one): scraping costs the request path nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from appliance.engine.model import ModelVersion
from appliance.engine.server_wide import ServerWide
from appliance.engine.stats import LATENCY_BUCKETS_US, FailureReason

__all__ = ["TritonCollector", "render"]

_REASONS = (FailureReason.REJECTED, FailureReason.CANCELED, FailureReason.BACKEND, FailureReason.OTHER)


class TritonCollector:
    def __init__(self, models: Callable[[], list[ModelVersion]], system: Callable[[], dict[str, Any] | None],
                 arenas: Callable[[], dict[str, int] | None] = lambda: None,
                 server: ServerWide | None = None,
                 residency: Callable[[], dict[str, Any] | None] = lambda: None) -> None:
        """``arenas``: the latest sample of the Python backend's shared-memory arenas, bytes by model.
        ``server``: the response cache and rate limiter, whose own figures are exported when present.
        ``residency``: what each loaded model holds and the loads and unloads by cause (``Residency.status``;
        None: residency off)."""
        self._models = models
        self._system = system
        self._arenas = arenas
        self._server = server or ServerWide()
        self._residency = residency

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]

        def counter(name: str, text: str) -> _TritonCounter:
            return _TritonCounter(name, text, labels)

        success = counter("nv_inference_request_success", "Number of successful inference requests")
        failure = _TritonCounter("nv_inference_request_failure", "Number of failed inference requests",
                                 [*labels, "reason"])
        count = counter("nv_inference_count", "Number of inferences performed (batch items)")
        executions = counter("nv_inference_exec_count", "Number of model executions (batches)")
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Requests queued, not yet executing",
                                    labels=labels)
        request_us = counter("nv_inference_request_duration_us", "Cumulative request duration (us)")
        queue_us = counter("nv_inference_queue_duration_us", "Cumulative time requests waited in queue (us)")
        input_us = counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration (us)")
        infer_us = counter("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration (us)")
        output_us = counter("nv_inference_compute_output_duration_us", "Cumulative compute output duration (us)")
        latency = HistogramMetricFamily("nv_inference_request_latency_seconds",
                                        "Request latency from arrival to response", labels=labels)
        # The sequence batcher's own (Triton exports none): models with sequence_batching only.
        sequences = GaugeMetricFamily("appliance_sequence_active", "Sequences holding a batch slot", labels=labels)
        backlog = GaugeMetricFamily("appliance_sequence_backlog", "Started sequences waiting for a slot",
                                    labels=labels)
        sequence_ends = _TritonCounter("appliance_sequence_count",
                                       "Sequences started, ended (END flag), reaped (idle) or rejected (no slot)",
                                       [*labels, "event"])
        # Triton's per-model cache counters, for models whose responses are cached only (as Triton).
        cache_hits = counter("nv_cache_num_hits_per_model", "Number of cache hits per model")
        cache_misses = counter("nv_cache_num_misses_per_model", "Number of cache misses per model")
        cache_hit_us = counter("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds")
        cache_miss_us = counter("nv_cache_miss_duration_per_model",
                                "Total cache miss (insert+lookup) duration per model, in microseconds")
        limited_waits = counter("appliance_rate_limiter_waits",
                                "Executions that waited for rate-limiter resources (models under the rate limiter)")
        limited_us = counter("appliance_rate_limiter_wait_duration_us",
                             "Cumulative time executions waited for rate-limiter resources (us)")
        models = self._models()
        for model in models:
            values = [model.name, str(model.version)]
            stats = model.stats
            if model.response_cache is not None:
                cache_hits.add_metric(values, stats.cache_hit.count)
                cache_misses.add_metric(values, stats.cache_miss.count)
                cache_hit_us.add_metric(values, stats.cache_hit.ns // 1000)
                cache_miss_us.add_metric(values, stats.cache_miss.ns // 1000)
            if stats.rate_limiter is not None:
                limited_waits.add_metric(values, stats.rate_limiter.waits)
                limited_us.add_metric(values, stats.rate_limiter.wait_ns // 1000)
            success.add_metric(values, stats.success.count)
            for reason in _REASONS:
                failure.add_metric([*values, reason], stats.failures.get(reason, 0))
            count.add_metric(values, stats.inference_count)
            executions.add_metric(values, stats.execution_count)
            pending.add_metric(values, model.scheduler.pending)
            request_us.add_metric(values, (stats.success.ns + stats.fail.ns) // 1000)
            queue_us.add_metric(values, stats.queue.ns // 1000)
            compute_input, compute_infer, compute_output = stats.compute()
            input_us.add_metric(values, compute_input.ns // 1000)
            infer_us.add_metric(values, compute_infer.ns // 1000)
            output_us.add_metric(values, compute_output.ns // 1000)
            cumulative, buckets = 0, []
            for bound, n in zip([*LATENCY_BUCKETS_US, None], stats.latency_histogram):
                cumulative += n
                buckets.append(("+Inf" if bound is None else str(bound / 1e6), cumulative))
            latency.add_metric(values, buckets, (stats.success.ns + stats.fail.ns) / 1e9)
            if stats.sequences is not None:
                sequences.add_metric(values, stats.sequences.active)
                backlog.add_metric(values, stats.sequences.backlog)
                for event in ("started", "ended", "reaped", "rejected"):
                    sequence_ends.add_metric([*values, event], getattr(stats.sequences, event))
        yield from (success, failure, count, executions, pending, request_us, queue_us, input_us, infer_us,
                    output_us, latency)
        if sequences.samples:  # only where a model has sequence_batching
            yield from (sequences, backlog, sequence_ends)
        if cache_hits.samples:
            yield from (cache_hits, cache_misses, cache_hit_us, cache_miss_us)
        yield from self._cache_metrics()
        yield from self._rate_limiter_metrics(limited_waits, limited_us)
        arenas = self._arenas()
        if arenas is not None:
            family = GaugeMetricFamily(
                "appliance_python_arena_bytes",
                "Shared memory (/dev/shm) the Python backend's tensor arenas take for a model, daemon and model "
                "processes together, in bytes (outside the request memory budget)", labels=["model"])
            for name, used in sorted(arenas.items()):
                family.add_metric([name], used)
            yield family
        yield from self._residency_metrics()
        yield from self._system_metrics()

    def _residency_metrics(self) -> Iterator[Metric]:
        status = self._residency()
        if status is None:
            return
        held = GaugeMetricFamily(
            "appliance_model_memory_bytes",
            "What a loaded model holds, in bytes: its model processes' RSS and the daemon's growth at its load "
            "(docs/memory.md)", labels=["model"])
        for name, size in status["models"].items():
            held.add_metric([name], size)
        yield held
        yield GaugeMetricFamily("appliance_model_memory_used_bytes",
                                "What the loaded models hold together, with the loads under way reserve",
                                value=status["used_bytes"])
        if status["budget_bytes"] is not None:
            yield GaugeMetricFamily("appliance_model_memory_budget_bytes", "The model memory budget",
                                    value=status["budget_bytes"])
        for kind, text in (("loads", "Model loads, by cause (start, demand, explicit)"),
                           ("unloads", "Model unloads by the appliance, by cause (idle, budget, pressure)")):
            family = _TritonCounter(f"appliance_model_{kind}", text, ["model", "cause"])
            for row in status[kind]:
                family.add_metric([row["model"], row["cause"]], row["count"])
            yield family

    def _cache_metrics(self) -> Iterator[Metric]:
        """The response cache's own figures, under the names Triton's local cache reports them."""
        cache = self._server.response_cache
        if cache is None:
            return
        for name, text, value in cache.gauges():
            yield GaugeMetricFamily(name, text, value=value)

    def _rate_limiter_metrics(self, waits: Metric, wait_us: Metric) -> Iterator[Metric]:
        limiter = self._server.rate_limiter
        if limiter is None:
            return
        labels = ["resource", "device"]
        capacity = GaugeMetricFamily("appliance_rate_limiter_resource_count",
                                     "Copies of a rate-limiter resource (per device, or device=global)", labels=labels)
        in_use = GaugeMetricFamily("appliance_rate_limiter_resource_in_use",
                                   "Copies of a rate-limiter resource held by executing instances", labels=labels)
        for resource in limiter.resources():
            capacity.add_metric([resource["name"], resource["device"]], resource["capacity"])
            in_use.add_metric([resource["name"], resource["device"]], resource["in_use"])
        yield from (capacity, in_use, waits, wait_us)

    def _system_metrics(self) -> Iterator[Metric]:
        sample = self._system()
        if not sample:
            return
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
                                value=sample["cpu_percent"] / 100.0)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
                                value=sample["memory_total"])
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                                value=sample["memory_used"])
        gpus = [g for g in sample.get("gpus", []) if "utilization_percent" in g]
        if not gpus:
            return
        families = {
            "nv_gpu_utilization": ("GPU utilization rate [0.0 - 1.0]", lambda g: g["utilization_percent"] / 100.0),
            "nv_gpu_memory_total_bytes": ("GPU total memory, in bytes", lambda g: g["memory_total"]),
            "nv_gpu_memory_used_bytes": ("GPU used memory, in bytes", lambda g: g["memory_used"]),
            "nv_gpu_power_usage": ("GPU power usage in watts", lambda g: g["power_watts"]),
            "nv_gpu_temperature": ("GPU temperature in Celsius", lambda g: g["temperature_c"]),
        }
        for name, (text, value) in families.items():
            family = GaugeMetricFamily(name, text, labels=["gpu_uuid"])
            for gpu in gpus:
                family.add_metric([str(gpu["index"])], value(gpu))
            yield family


class _TritonCounter(Metric):
    """A counter under Triton's exact name: prometheus-client would add ``_total`` to the samples,
    and Triton's users query ``nv_inference_request_success``, not ``..._total``."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        super().__init__(name, documentation, "counter")
        self._labels = labels

    def add_metric(self, values: list[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labels, values)), value)


_HEADER = re.compile(r"^(# (?:HELP|TYPE) (?:nv|appliance)_\w+?)_total ", re.MULTILINE)


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition, with the HELP/TYPE lines of Triton's counters under their own names."""
    return _HEADER.sub(r"\1 ", generate_latest(registry).decode()).encode()
