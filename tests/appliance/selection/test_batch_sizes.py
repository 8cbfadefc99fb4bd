"""Selection measures the chosen plan's throughput by batch size and gives the batcher a cap where larger
batches add nothing; the cap is the largest size within BATCH_WITHIN of the best."""

from __future__ import annotations

import hardware_probe
from appliance.selection import Hardware, Selector
from appliance.selection.candidates import batch_cap
from appliance.selection.selector import SelectionSettings
from tests.appliance.selection.contexts import ONNX, onnx_context
from tests.builders import affine_model, save


def test_the_cap_is_the_largest_size_near_the_best():
    assert batch_cap({1: 100.0, 2: 180.0, 4: 200.0, 8: 196.0, 16: 120.0}, 16) == 8
    assert batch_cap({1: 100.0, 2: 180.0, 4: 200.0}, 4) is None  # the best is the largest: nothing to cap
    assert batch_cap({}, 8) is None


def test_a_dynamically_batched_model_gets_its_batch_curve_in_the_decision(tmp_path):
    model = save(affine_model(2.0, 1.0), tmp_path / "affine" / "1" / "model.onnx")
    context = onnx_context(model, "max_batch_size: 8\ndynamic_batching { }\n")
    selector = Selector(Hardware.of(hardware_probe.probe(timeout=30)), None, SelectionSettings(budget=0.05))
    batching = selector.choose(ONNX, context).decision["batching"]
    assert set(batching["items_per_s"]) == {"1", "2", "4", "8"}
    assert all(rate > 0 for rate in batching["items_per_s"].values())
    assert batching["cap"] == batch_cap({int(k): v for k, v in batching["items_per_s"].items()}, 8)
    assert batching["reason"]
