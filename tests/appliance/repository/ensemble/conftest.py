"""The ensemble tests' registries: loaded over a repository a builder of ``repos`` writes."""

from __future__ import annotations

import pytest

from appliance.backends import RuntimeOptions
from appliance.repository.registry import ModelRegistry, ModelState


@pytest.fixture
async def registry_of(tmp_path):
    """registry_of(builder) -> a loaded registry over the repository ``builder`` writes; closed after."""
    made: list[ModelRegistry] = []

    async def make(builder) -> ModelRegistry:
        registry = ModelRegistry(builder(tmp_path / "repo"), RuntimeOptions(), drain_timeout=5)
        made.append(registry)
        await registry.load_all()
        assert all(e.state is ModelState.READY for e in registry.entries()), [
            (e.name, e.reason) for e in registry.entries()]
        return registry

    yield make
    for registry in made:
        await registry.close(10)
