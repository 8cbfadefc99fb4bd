"""Statistics in Triton's shape: what Triton 2.51 reports, member for member (tests/oracle compares the
two servers; these pin the rules down without one)."""

from __future__ import annotations

from appliance.engine.stats import BatchTiming, ModelStats


def test_the_document_has_tritons_members():
    document = ModelStats().as_json()
    assert list(document) == ["last_inference", "inference_count", "execution_count", "inference_stats",
                              "batch_stats", "response_stats", "memory_usage"]
    assert document["response_stats"] == {} and document["memory_usage"] == []


def test_a_failed_execution_counts_as_an_execution_but_not_an_inference():
    stats = ModelStats()
    stats.record_batch(1, 1, [10], BatchTiming(input_ns=1, infer_ns=2, output_ns=3))
    stats.record_failed_batch(1)
    document = stats.as_json()
    assert (document["inference_count"], document["execution_count"]) == (1, 2)
    assert document["inference_stats"]["compute_infer"] == {"count": 1, "ns": 2}
    assert document["batch_stats"][0]["compute_infer"]["count"] == 2  # Triton's batch row counts it


def test_a_groups_executions_count_as_each_one_recorded_alone():
    timing = BatchTiming(input_ns=3, infer_ns=50, output_ns=7)
    together, alone = ModelStats(), ModelStats()
    together.record_executions([1, 2, 1], [10, 20, 30], timing)
    for size, waited in ((1, 10), (2, 20), (1, 30)):
        alone.record_batch(size, 1, [waited], timing)
    assert together.as_json() | {"last_inference": 0} == alone.as_json() | {"last_inference": 0}
    together.record_executions([], [], timing)  # a group whose every execution failed: nothing ran
    assert together.as_json()["execution_count"] == 3


def test_each_request_of_a_batch_counts_its_batchs_whole_time():
    stats = ModelStats()
    stats.record_batch(3, 2, [10, 30], BatchTiming(input_ns=4, infer_ns=100, output_ns=6))  # two requests, 3 items
    stats.record_batch(1, 1, [5], BatchTiming(input_ns=1, infer_ns=20, output_ns=2))
    document = stats.as_json()
    assert (document["inference_count"], document["execution_count"]) == (4, 2)
    assert document["inference_stats"]["queue"] == {"count": 3, "ns": 45}
    assert document["inference_stats"]["compute_input"] == {"count": 3, "ns": 4 * 2 + 1}
    assert document["inference_stats"]["compute_infer"] == {"count": 3, "ns": 100 * 2 + 20}
    assert document["inference_stats"]["compute_output"] == {"count": 3, "ns": 6 * 2 + 2}
    assert document["batch_stats"] == [  # by size: each execution once, with its own time
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 1}, "compute_infer": {"count": 1, "ns": 20},
         "compute_output": {"count": 1, "ns": 2}},
        {"batch_size": 3, "compute_input": {"count": 1, "ns": 4}, "compute_infer": {"count": 1, "ns": 100},
         "compute_output": {"count": 1, "ns": 6}},
    ]
    assert [(d.count, d.ns) for d in stats.compute()] == [(3, 9), (3, 220), (3, 14)]  # what the metrics read
