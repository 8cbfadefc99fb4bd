"""An ensemble's response cache (Triton: cached at the top level, a hit skips every step), its refusal over a
step that cannot be cached, and the transaction policy its config shows."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import RuntimeOptions
from appliance.core.errors import ConfigError
from appliance.engine.response_cache import ResponseCache
from appliance.engine.server_wide import ServerWide
from appliance.engine.types import InferInput, InferRequest
from appliance.repository.config import config_to_json
from appliance.repository.ensemble import check_composition, plan_ensemble
from appliance.repository.ensemble.load import load_ensemble
from appliance.repository.registry import ModelRegistry, ModelState
from tests.appliance.repository.ensemble.repos import F8, chain_repository, ensemble_config, step, write_ensemble

CACHED = "response_cache { enable: true }\n"


@pytest.fixture
async def registry(tmp_path):
    root = chain_repository(tmp_path / "repo")
    write_ensemble(root, "cached_chain", ensemble_config(
        [("IN", "TYPE_FP32", F8)], [("OUT", "TYPE_FP32", F8)],
        [step("double", {"x": "IN"}, {"y": "T"}), step("plus_one", {"x": "T"}, {"y": "OUT"})], extra=CACHED))
    made = ModelRegistry(root, RuntimeOptions(), drain_timeout=2, server=ServerWide(ResponseCache(1 << 20)))
    await made.load_all()
    yield made
    await made.close(5)


def _request(value: float) -> InferRequest:
    return InferRequest([InferInput("IN", "FP32", np.full((1, 8), value, np.float32))])


async def test_an_ensemble_caches_at_the_top_level_and_a_hit_runs_no_step(registry):
    ensemble = registry.get("cached_chain")
    first = await ensemble.infer(_request(1.0))
    again = await ensemble.infer(_request(1.0))
    np.testing.assert_array_equal(again.outputs[0].data, first.outputs[0].data)
    np.testing.assert_array_equal(again.outputs[0].data, np.full((1, 8), 3.0, np.float32))
    assert registry.get("double").stats.inference_count == 1  # the hit never reached the steps
    assert registry.get("plus_one").stats.inference_count == 1
    counts = ensemble.stats.as_json()["inference_stats"]
    assert counts["cache_hit"]["count"] == 1 and counts["cache_miss"]["count"] == 1
    await ensemble.infer(_request(2.0))
    assert registry.get("double").stats.inference_count == 2


async def test_an_ensemble_without_response_cache_runs_its_steps_each_time(registry):
    chain = registry.get("chain")
    for _ in range(2):
        await chain.infer(_request(1.0))
    assert registry.get("double").stats.inference_count == 2
    assert chain.response_cache is None


async def test_an_ensembles_config_shows_its_transaction_policy_as_triton(registry):
    document = config_to_json(registry.entry("cached_chain").config)
    assert document["model_transaction_policy"] == {"decoupled": False}
    assert document["response_cache"] == {"enable": True}
    assert document["ensemble_scheduling"]["max_inflight_requests"] == 0
    assert "response_cache" not in config_to_json(registry.entry("chain").config)  # shown only when set
    assert registry.entry("cached_chain").state is ModelState.READY


def _cached_ensemble_over(name: str, model: str, model_config: str) -> tuple[mc.ModelConfig, mc.ModelConfig]:
    """A cached one-step ensemble ``name`` (IN -> OUT) over ``model`` (x -> y, FP32 [8], max batch 8) and
    that model's config, ``model_config`` added to it."""
    ensemble = text_format.Parse(
        f'name: "{name}" platform: "ensemble" max_batch_size: 8 ' + CACHED
        + 'input [{ name: "IN" data_type: TYPE_FP32 dims: [8] }] '
        + 'output [{ name: "OUT" data_type: TYPE_FP32 dims: [8] }]'
        + ' ensemble_scheduling { step [' + step(model, {"x": "IN"}, {"y": "OUT"}) + '] }', mc.ModelConfig())
    composing = text_format.Parse(
        f'name: "{model}" max_batch_size: 8 {model_config} '
        'input [{ name: "x" data_type: TYPE_FP32 dims: [8] }] output [{ name: "y" data_type: TYPE_FP32 dims: [8] }]',
        mc.ModelConfig())
    return ensemble, composing


def test_an_ensemble_over_a_sequence_model_cannot_cache():
    ensemble, stateful = _cached_ensemble_over("seq_chain", "stateful", "sequence_batching {}")
    plan = plan_ensemble(ensemble)
    with pytest.raises(ConfigError, match="Response Cache does not currently support model seq_chain: its step 1 "
                                          r"\(model 'stateful'\) uses the sequence batching scheduler"):
        check_composition(plan, ensemble, lambda _: stateful)
    ensemble.ClearField("response_cache")
    check_composition(plan, ensemble, lambda _: stateful)  # without the cache it composes


def test_a_decoupled_ensemble_cannot_cache_in_tritons_words(tmp_path):
    ensemble, decoupled = _cached_ensemble_over("streamer", "repeat",
                                                'backend: "python" model_transaction_policy { decoupled: true }')
    (tmp_path / "streamer" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match="Response Cache does not currently support model streamer with 'decoupled' "
                                          "transaction policy. Please disable the response cache."):
        load_ensemble(tmp_path / "streamer", ensemble, plan_ensemble(ensemble), lambda _: decoupled,
                      lambda *_: None, ResponseCache(1 << 20))
