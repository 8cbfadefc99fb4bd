"""Per-model-version counters in the shape of Triton's statistics extension.

Updated on the event loop only (no locks); durations are nanoseconds, as Triton reports them.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appliance.engine.rate_limiter import RateLimitCounts

__all__ = ["LATENCY_BUCKETS_US", "BatchTiming", "Duration", "FailureReason", "ModelStats", "SequenceCounts",
           "StepTiming"]

# Upper bounds (µs) of the request latency histogram; one more bucket holds everything above.
LATENCY_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
                      500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000)


class FailureReason:
    """Triton's failure reasons (the ``reason`` label of nv_inference_request_failure)."""

    REJECTED = "REJECTED"  # queue full, queue timeout, model unloading
    CANCELED = "CANCELED"  # the client went away
    BACKEND = "BACKEND"  # the runtime failed
    OTHER = "OTHER"


@dataclasses.dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclasses.dataclass(slots=True)
class BatchTiming:
    """What one execution cost, measured on the instance thread."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    start_ns: int = 0
    """When the batch started and ended (``time.monotonic_ns()``), for traces."""
    end_ns: int = 0


@dataclasses.dataclass(slots=True)
class StepTiming:
    """What one request spent queued and computing in the schedulers it passed through: an ensemble
    hands one to each of its steps and reports the sums as its own queue and compute times."""

    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def add(self, queue_ns: int, timing: BatchTiming | StepTiming) -> None:
        self.queue_ns += queue_ns
        self.input_ns += timing.input_ns
        self.infer_ns += timing.infer_ns
        self.output_ns += timing.output_ns


@dataclasses.dataclass(slots=True)
class SequenceCounts:
    """A sequence model's sequences (Triton's statistics have none: reported as ``sequence_stats``, an
    extra member tritonclient's JSON and protobuf parsers both skip)."""

    active: int = 0
    """Sequences holding a batch slot (or candidate place) now."""
    backlog: int = 0
    """Started sequences waiting for a slot."""
    started: int = 0
    ended: int = 0
    """Ended by a request with the END flag."""
    reaped: int = 0
    """Ended after max_sequence_idle_microseconds without a request."""
    rejected: int = 0
    """New sequences refused because every slot and the backlog were full."""


@dataclasses.dataclass(slots=True)
class _BatchBucket:
    """One batch size's executions, as plain counters (a batch updates one bucket; the model's totals are
    summed from the buckets when read): how many ran (those that failed as a whole too), the requests they
    ran, their compute times, and what batches of several requests add to the totals, where each request
    counts its batch's whole time (Triton's)."""

    executions: int = 0
    requests: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    shared_input_ns: int = 0
    """Over batches of several requests: each batch's time times its requests but one."""
    shared_infer_ns: int = 0
    shared_output_ns: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"compute_input": {"count": self.executions, "ns": self.input_ns},
                "compute_infer": {"count": self.executions, "ns": self.infer_ns},
                "compute_output": {"count": self.executions, "ns": self.output_ns}}


class ModelStats:
    def __init__(self) -> None:
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.cache_hit = Duration()
        """Requests answered from the response cache, and the time their lookups took."""
        self.cache_miss = Duration()
        """Requests the response cache did not hold (answered by the model, then kept), and the time their
        lookups and insertions took."""
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, _BatchBucket] = {}
        self.failures: Counter[str] = Counter()
        self.latency_histogram = [0] * (len(LATENCY_BUCKETS_US) + 1)
        """Request counts per latency bucket (cumulative over the version's life, like the rest)."""
        self.sequences: SequenceCounts | None = None
        """Set for a model served by the sequence batcher."""
        self.rate_limiter: RateLimitCounts | None = None
        """Set for a model whose instances run under the rate limiter."""

    def record_request(self, ok: bool, duration_ns: int, reason: str = FailureReason.OTHER) -> None:
        if ok:
            success = self.success  # (Duration.add inline: every request passes here)
            success.count += 1
            success.ns += duration_ns
        else:
            self.fail.add(duration_ns)
            self.failures[reason] += 1
        self.latency_histogram[bisect.bisect_left(LATENCY_BUCKETS_US, duration_ns // 1000)] += 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_hit(self, duration_ns: int) -> None:
        """A request answered from the response cache: it never queued (Triton counts it in ``queue``
        with no time) and never ran, so the compute and execution counters stay as they were."""
        self.cache_hit.add(duration_ns)
        self.queue.add(0)

    def record_cache_miss(self, duration_ns: int) -> None:
        self.cache_miss.add(duration_ns)

    def record_batch(self, batch_size: int, requests: int, queue_ns: list[int], timing: BatchTiming) -> None:
        self.execution_count += 1
        self.inference_count += batch_size
        bucket = self.batches.get(batch_size)
        if bucket is None:
            bucket = self.batches[batch_size] = _BatchBucket()
        # (Duration.add written out: every batch passes here, one request each at low load)
        queue = self.queue
        queue.count += len(queue_ns)
        queue.ns += sum(queue_ns)
        bucket.executions += 1
        bucket.requests += requests
        bucket.input_ns += timing.input_ns
        bucket.infer_ns += timing.infer_ns
        bucket.output_ns += timing.output_ns
        if requests > 1:
            others = requests - 1
            bucket.shared_input_ns += timing.input_ns * others
            bucket.shared_infer_ns += timing.infer_ns * others
            bucket.shared_output_ns += timing.output_ns * others

    def record_executions(self, batch_sizes: list[int], queue_ns: list[int], timing: BatchTiming) -> None:
        """A group's executions (one request each, of ``batch_sizes``), each as ``record_batch`` counts one
        of one request that waited ``queue_ns`` and cost ``timing``: counted together."""
        runs = len(batch_sizes)
        if not runs:
            return
        self.execution_count += runs
        self.inference_count += sum(batch_sizes)
        self.queue.add(sum(queue_ns), runs)
        sizes: dict[int, int] = {}
        for size in batch_sizes:
            sizes[size] = sizes.get(size, 0) + 1
        for size, count in sizes.items():
            bucket = self.batches.get(size)
            if bucket is None:
                bucket = self.batches[size] = _BatchBucket()
            bucket.executions += count
            bucket.requests += count
            bucket.input_ns += timing.input_ns * count
            bucket.infer_ns += timing.infer_ns * count
            bucket.output_ns += timing.output_ns * count

    def record_failed_batch(self, batch_size: int) -> None:
        """An execution that failed as a whole (the model raised): Triton counts the execution, in
        ``execution_count`` and its batch size's row, but no inference and no compute time."""
        self.execution_count += 1
        bucket = self.batches.get(batch_size)
        if bucket is None:
            bucket = self.batches[batch_size] = _BatchBucket()
        bucket.executions += 1

    def compute(self) -> tuple[Duration, Duration, Duration]:
        """Every request's share of its executions' input, infer and output times (a request counts its
        batch's whole time, as Triton counts it), summed from the buckets."""
        requests = input_ns = infer_ns = output_ns = 0
        for bucket in self.batches.values():
            requests += bucket.requests
            input_ns += bucket.input_ns + bucket.shared_input_ns
            infer_ns += bucket.infer_ns + bucket.shared_infer_ns
            output_ns += bucket.output_ns + bucket.shared_output_ns
        return Duration(requests, input_ns), Duration(requests, infer_ns), Duration(requests, output_ns)

    def batch_histogram(self) -> dict[int, int]:
        return {size: bucket.executions for size, bucket in sorted(self.batches.items())}

    def as_json(self) -> dict[str, Any]:
        document = self._triton_json()
        if self.sequences is not None:
            document["sequence_stats"] = dataclasses.asdict(self.sequences)
        if self.rate_limiter is not None:
            document["rate_limiter_stats"] = dataclasses.asdict(self.rate_limiter)
        return document

    def _triton_json(self) -> dict[str, Any]:
        computed = self.compute()
        return {
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": computed[0].as_json(),
                "compute_infer": computed[1].as_json(),
                "compute_output": computed[2].as_json(),
                "cache_hit": self.cache_hit.as_json(),
                "cache_miss": self.cache_miss.as_json(),
            },
            "batch_stats": [{"batch_size": size, **bucket.as_json()} for size, bucket in sorted(self.batches.items())],
            # Triton's members this server has nothing to put in yet: per-response statistics of
            # decoupled models, and the memory a version holds on each device.
            "response_stats": {},
            "memory_usage": [],
        }
