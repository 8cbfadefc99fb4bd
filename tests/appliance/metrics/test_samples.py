"""Per-interval samples from the cumulative counters the request path keeps."""

from __future__ import annotations

from appliance.engine.stats import LATENCY_BUCKETS_US, BatchTiming, FailureReason, ModelStats
from appliance.metrics.samples import ModelSample, Snapshotter, merge_samples


def _serve(stats: ModelStats, ok: int = 0, failed: int = 0, batch: int = 0, latency_ns: int = 2_000_000) -> None:
    for _ in range(ok):
        stats.record_request(True, latency_ns)
    for _ in range(failed):
        stats.record_request(False, latency_ns, FailureReason.BACKEND)
    if batch:
        stats.record_batch(batch, batch, [1000] * batch, BatchTiming(10, 20, 30))


def test_a_tick_reports_what_changed_since_the_last_one():
    stats, snapshots = ModelStats(), Snapshotter()
    _serve(stats, ok=3, failed=1, batch=2)
    (first,) = snapshots.take(100, [("m", 1, stats)])
    assert (first.t, first.model, first.version) == (100, "m", 1)
    assert (first.requests, first.success, first.failure) == (4, 3, 1)
    assert first.failure_reasons == {FailureReason.BACKEND: 1}
    assert (first.inferences, first.executions, first.batch_hist) == (2, 1, {"2": 1})
    assert (first.input_ns, first.infer_ns, first.output_ns) == (20, 40, 60)  # per request, as Triton counts
    assert sum(first.latency_hist) == 4 and len(first.latency_hist) == len(LATENCY_BUCKETS_US) + 1
    _serve(stats, ok=1)
    (second,) = snapshots.take(101, [("m", 1, stats)])
    assert (second.requests, second.success, second.failure, second.executions) == (1, 1, 0, 0)
    assert second.failure_reasons == {} and second.batch_hist == {}


def test_each_counter_of_a_tick_is_the_change_of_its_own_counter():
    stats, snapshots = ModelStats(), Snapshotter()
    _serve(stats, ok=1, batch=1, latency_ns=1_000_000)
    snapshots.take(1, [("m", 1, stats)])
    _serve(stats, ok=2, failed=1, batch=3, latency_ns=3_000_000)
    (sample,) = snapshots.take(2, [("m", 1, stats)])
    counts = (sample.requests, sample.success, sample.failure, sample.inferences, sample.executions)
    assert counts == (3, 2, 1, 3, 1)
    assert (sample.latency_ns, sample.queue_ns) == (9_000_000, 3000)
    assert (sample.input_ns, sample.infer_ns, sample.output_ns) == (30, 60, 90)
    assert sample.batch_hist == {"3": 1} and sample.failure_reasons == {FailureReason.BACKEND: 1}


def test_a_quiet_tick_has_no_sample_and_a_reloaded_version_starts_from_zero():
    stats, snapshots = ModelStats(), Snapshotter()
    _serve(stats, ok=5)
    snapshots.take(1, [("m", 1, stats)])
    assert snapshots.take(2, [("m", 1, stats)]) == []
    reloaded = ModelStats()  # the same name and version, new counters
    _serve(reloaded, ok=2)
    (sample,) = snapshots.take(3, [("m", 1, reloaded)])
    assert sample.requests == 2  # not 2 - 5


def test_what_replaced_or_unloaded_counters_gained_since_the_last_tick_is_not_lost():
    """A reload swaps a version's counters and an unload drops them between two ticks: the requests they
    took after the last tick are still counted, once."""
    old, gone, snapshots = ModelStats(), ModelStats(), Snapshotter()
    _serve(old, ok=5)
    _serve(gone, ok=1)
    snapshots.take(1, [("m", 1, old), ("g", 1, gone)])
    _serve(old, ok=3, failed=1)  # after the tick, before the reload
    _serve(gone, ok=2)  # after the tick, before the unload
    reloaded = ModelStats()
    _serve(reloaded, ok=2)
    samples = {s.model: s for s in snapshots.take(2, [("m", 1, reloaded)])}
    assert (samples["m"].requests, samples["m"].success, samples["m"].failure) == (6, 5, 1)
    assert sum(samples["m"].latency_hist) == 6
    assert samples["g"].requests == 2
    assert snapshots.take(3, [("m", 1, reloaded)]) == []  # counted once


def test_a_sample_survives_its_database_row():
    sample = ModelSample(7, "m", 2, requests=3, failure_reasons={"OTHER": 1}, latency_hist=[1, 2],
                         batch_hist={"4": 1})
    row = sample.row()
    assert isinstance(row["latency_hist"], str) and isinstance(row["batch_hist"], str)
    assert ModelSample.from_row(row) == sample
    empty = ModelSample.from_row({**row, "latency_hist": None, "batch_hist": None, "failure_reasons": ""})
    assert (empty.latency_hist, empty.batch_hist, empty.failure_reasons) == ([], {}, {})


def test_merging_sums_counters_histograms_and_reasons():
    a = ModelSample(60, "m", 1, requests=2, success=2, latency_ns=10, latency_hist=[1, 1],
                    failure_reasons={"OTHER": 1}, batch_hist={"1": 2})
    b = ModelSample(61, "m", 1, requests=3, failure=3, latency_ns=5, latency_hist=[0, 1, 2],
                    failure_reasons={"OTHER": 2, "BACKEND": 1}, batch_hist={"1": 1, "4": 1})
    merged = merge_samples(60, [a, b])
    assert (merged.t, merged.requests, merged.success, merged.failure, merged.latency_ns) == (60, 5, 2, 3, 15)
    assert merged.latency_hist == [1, 2, 2]  # a shorter histogram is padded, not truncated
    assert merged.failure_reasons == {"OTHER": 3, "BACKEND": 1} and merged.batch_hist == {"1": 3, "4": 1}
