"""When a served model is tuned again on its traffic, and how often."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.backends import RuntimeOptions
from appliance.backends.base import CALLS_UNAVAILABLE
from appliance.engine.types import InferInput
from appliance.repository.loader import load_model
from appliance.repository.registry import ModelEntry, ModelState
from appliance.repository.retune import RetunePolicy, Retuner, why_retune
from tests.builders import framing_model, write_model

POLICY = RetunePolicy(interval=60.0, min_requests=10)
TUNED_ON_512 = {"status": "measured", "tuned_on": "synthetic",
                "profile": [{"batch": 1, "shapes": {"audio": [1, 512]}}]}


@pytest.fixture
def model(tmp_path):
    loaded = load_model(write_model(tmp_path, "frames", framing_model()), RuntimeOptions())
    yield loaded.versions[1]
    asyncio.run(loaded.versions[1].close())


def _serve(model, samples: int, requests: int) -> None:
    for _ in range(requests):
        request = [InferInput("audio", "FP32", np.empty((1, samples), np.float32))]
        model.traffic.record(model.traffic.shapes(request), 1, in_flight=1)


def test_an_unmeasured_model_is_retuned_once_it_has_traffic(model):
    model.selection = {"status": "unmeasured", "profile": None}
    _serve(model, 4800, 9)
    assert why_retune(model, POLICY) is None  # not enough requests yet
    _serve(model, 4800, 1)
    assert "could not be measured" in why_retune(model, POLICY)


def test_an_unmeasured_model_is_not_retuned_again_on_the_traffic_it_was_tried_on(model):
    model.selection = {"status": "unmeasured", "profile": None,
                       "traffic_profile": {"samples": [{"batch": 1, "shapes": {"audio": [1, 4800]}}]}}
    _serve(model, 4800, 20)
    assert why_retune(model, POLICY) is None


def test_a_model_whose_calls_to_other_models_stopped_its_tuning_is_not_retuned(model):
    """Tuning cannot serve a BLS model's calls: no traffic would measure it, so it is not reloaded for it."""
    bls = f"Failed to process the request(s) for model 'bls_0_0', message: TritonModelException: {CALLS_UNAVAILABLE}"
    model.selection = {"status": "unmeasured", "profile": None,
                       "inputs_refused": [{"inputs": "synthetic inputs", "reason": bls}]}
    _serve(model, 4800, 20)
    assert why_retune(model, POLICY) is None
    # Refused for another reason too (a shape, a value): its traffic may be accepted, so it is retuned.
    model.selection["inputs_refused"].append({"inputs": "warmup samples", "reason": "unexpected shape [1, 3]"})
    assert "could not be measured" in why_retune(model, POLICY)


def test_a_measured_model_is_retuned_when_most_requests_have_other_shapes(model):
    model.selection = dict(TUNED_ON_512)
    _serve(model, 512, 10)
    _serve(model, 4800, 9)
    assert why_retune(model, POLICY) is None  # 47 %: not most of them
    _serve(model, 4800, 2)
    assert "52% of its requests have shapes {'audio': [1, 4800]}" in why_retune(model, POLICY)


@pytest.mark.parametrize("selection", [None, {"status": "only_plan"}, {"status": "off"}])
def test_models_that_selection_does_not_measure_are_left_alone(model, selection):
    model.selection = selection
    _serve(model, 4800, 20)
    assert why_retune(model, POLICY) is None


class _Registry:
    """The registry's surface the retuner uses: its entries and retune."""

    def __init__(self, entry: ModelEntry) -> None:
        self._entries = [entry]
        self.retuned: list[tuple[str, dict]] = []

    def entries(self) -> list[ModelEntry]:
        return self._entries

    async def retune(self, name: str, traffic: dict) -> None:
        self.retuned.append((name, traffic))


def test_a_model_is_retuned_at_most_once_per_interval(model):
    model.selection = {"status": "unmeasured", "profile": None}
    _serve(model, 4800, 10)
    registry = _Registry(ModelEntry("frames", ModelState.READY, versions={1: model}))
    now = [1000.0]
    retuner = Retuner(registry, POLICY, clock=lambda: now[0])
    assert asyncio.run(retuner.check()) == ["frames"]
    assert registry.retuned == [("frames", {1: {"samples": [{"batch": 1, "shapes": {"audio": [1, 4800]}}],
                                                "concurrency": 1}})]
    now[0] += 59
    assert asyncio.run(retuner.check()) == []
    now[0] += 2
    assert asyncio.run(retuner.check()) == ["frames"]
