"""Traffic statistics: request shapes per item, batch sizes, concurrency; bounded memory."""

from __future__ import annotations

import numpy as np

from appliance.engine.traffic import MAX_SHAPES, TrafficStats
from appliance.engine.types import InferInput


def _inputs(*shapes: tuple[str, tuple[int, ...]]) -> list[InferInput]:
    return [InferInput(name, "FP32", np.empty(shape, np.float32)) for name, shape in shapes]


def test_a_batching_model_counts_shapes_per_item_and_profiles_its_common_batch():
    stats = TrafficStats(batched=True)
    for batch in (4, 4, 4, 1):
        stats.record(stats.shapes(_inputs(("x", (batch, 3, 8)))), batch, in_flight=2)
    stats.record(stats.shapes(_inputs(("x", (2, 3, 9)))), 2, in_flight=1)
    shapes, share = stats.dominant()
    assert shapes == {"x": [3, 8]} and share == 0.8
    assert stats.profile() == {"samples": [{"batch": 1, "shapes": {"x": [1, 3, 8]}},
                                           {"batch": 4, "shapes": {"x": [4, 3, 8]}}], "concurrency": 2}


def test_an_unbatched_model_keeps_whole_shapes():
    stats = TrafficStats(batched=False)
    stats.record(stats.shapes(_inputs(("audio", (1, 4800)), ("sr", ()))), 1, in_flight=1)
    assert stats.profile() == {"samples": [{"batch": 1, "shapes": {"audio": [1, 4800], "sr": []}}],
                               "concurrency": 1}


def test_distinct_shapes_are_bounded_and_the_rest_counted_as_other():
    stats = TrafficStats(batched=False)
    for size in range(MAX_SHAPES + 10):
        stats.record(stats.shapes(_inputs(("x", (size,)))), 1, in_flight=1)
    document = stats.as_json()
    assert len(document["shapes"]) == MAX_SHAPES and document["other_shapes"] == 10
    assert document["requests"] == MAX_SHAPES + 10


def test_concurrency_is_the_90th_percentile_of_requests_in_flight():
    stats = TrafficStats(batched=False)
    for in_flight in [1] * 85 + [8] * 15:
        stats.record(stats.shapes(_inputs(("x", (1,)))), 1, in_flight)
    assert stats.concurrency() == 8
    assert TrafficStats(batched=False).profile() is None
