"""An ensemble's lifecycle follows its composing models: loading it loads them (explicit mode), it is
ready only when they are, it goes down when one of them is unloaded or no longer fits, and
unload_dependents takes its composing models with it."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.backends import RuntimeOptions
from appliance.core.errors import ModelNotFound
from appliance.engine.types import InferInput, InferRequest
from appliance.repository.registry import ModelRegistry, ModelState
from tests.appliance.repository.ensemble.repos import diamond_repository, nested_repository


@pytest.fixture
async def registry(tmp_path):
    """A registry in explicit mode over the diamond and nested ensembles: nothing loaded yet."""
    repo = diamond_repository(tmp_path / "repo")
    nested_repository(repo)
    made = ModelRegistry(repo, RuntimeOptions(), drain_timeout=5)
    await made.load_all([])
    yield made
    await made.close(10)


def states(registry: ModelRegistry) -> dict[str, str]:
    return {e.name: e.state.value for e in registry.entries()}


async def run(registry: ModelRegistry, name: str) -> np.ndarray:
    model = registry.get(name)
    with model.in_use():
        response = await model.infer(InferRequest([InferInput("IN", "FP32", np.ones((1, 8), np.float32))]))
    return response.outputs[-1].data


async def test_loading_an_ensemble_loads_what_it_needs_and_nothing_else(registry):
    await registry.load("outer")
    assert states(registry) == {"chain": "READY", "diamond": "UNAVAILABLE", "double": "READY", "outer": "READY",
                                "plus_one": "READY", "two_outputs": "UNAVAILABLE"}
    np.testing.assert_allclose(await run(registry, "outer"), 4.0)
    assert registry.all_ready  # the models left unloaded are not failures


async def test_unloading_a_composing_model_takes_its_ensembles_down_with_a_reason(registry):
    await registry.load("outer")
    await registry.unload("plus_one")
    for name in ("chain", "outer"):
        entry = registry.entry(name)
        assert entry.state is ModelState.UNAVAILABLE
        assert "its composing model" in entry.reason
    assert "'plus_one'" in registry.entry("chain").reason
    with pytest.raises(ModelNotFound, match="composing model 'plus_one' was unloaded"):
        registry.get("chain")
    assert registry.entry("double").state is ModelState.READY
    await registry.load("outer")  # and it comes back with them
    np.testing.assert_allclose(await run(registry, "outer"), 4.0)


async def test_unload_dependents_unloads_the_composing_models_no_other_ensemble_uses(registry):
    await registry.load("chain")
    await registry.load("diamond")
    await registry.unload("chain", unload_dependents=True)
    assert states(registry)["chain"] == "UNAVAILABLE"
    assert states(registry)["double"] == "READY" and states(registry)["plus_one"] == "READY"  # diamond uses them
    await registry.unload("diamond", unload_dependents=True)
    assert {n: s for n, s in states(registry).items() if s == "READY"} == {}
    await registry.load("chain")
    await registry.unload("chain")  # without the parameter the composing models stay
    assert states(registry)["double"] == "READY"


async def test_a_composing_model_reloaded_with_a_config_the_ensemble_no_longer_fits_takes_it_down(registry):
    await registry.load("chain")
    (registry.repository / "plus_one" / "config.pbtxt").write_text("max_batch_size: 2\n")
    await registry.load("plus_one")
    chain = registry.entry("chain")
    assert chain.state is ModelState.UNAVAILABLE
    assert "no longer fits" in chain.reason and "maximum batch size to be 2" in chain.reason
    assert not registry.all_ready  # a failure under strict readiness, not a deliberate unload


async def test_a_composing_model_that_failed_is_loaded_again_when_the_ensemble_is(registry):
    config = registry.repository / "plus_one" / "config.pbtxt"
    good = config.read_text()
    config.write_text("max_batch_size: -3\n")
    with pytest.raises(Exception, match="depends on 'plus_one', which failed to load"):
        await registry.load("chain")
    assert registry.entry("chain").state is ModelState.UNAVAILABLE
    config.write_text(good)
    await registry.load("chain")
    assert registry.entry("chain").state is ModelState.READY


async def test_in_poll_mode_an_ensemble_comes_back_with_its_composing_model(registry, tmp_path):
    await registry.load("chain")
    kept = tmp_path / "kept"
    (registry.repository / "plus_one").rename(kept)
    await registry.rescan()
    assert registry.entry("chain").state is ModelState.UNAVAILABLE
    assert "removed from the repository" in registry.entry("chain").reason
    kept.rename(registry.repository / "plus_one")
    await registry.rescan()
    assert registry.entry("chain").state is ModelState.READY
    np.testing.assert_allclose(await run(registry, "chain"), 3.0)


def test_the_backend_loader_refuses_an_ensemble_and_names_the_models_to_tune(tmp_path):
    from appliance.core.errors import ConfigError
    from appliance.repository.loader import load_model

    repo = diamond_repository(tmp_path / "repo")
    with pytest.raises(ConfigError, match=r"'chain' is an ensemble: .* composing models \['double', 'plus_one'\]"):
        load_model(repo / "chain", RuntimeOptions())
