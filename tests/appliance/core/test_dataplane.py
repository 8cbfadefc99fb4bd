"""The data plane's view of the registry, without any transport."""

from __future__ import annotations

import asyncio

from appliance.backends import RuntimeOptions
from appliance.core.dataplane import DataPlane
from appliance.core.registry import ModelRegistry
from appliance.examples import build_example_repository


async def test_status_line_does_not_count_models_left_unloaded_as_failed(tmp_path):
    repo = build_example_repository(tmp_path / "repo")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    registry = ModelRegistry(repo, RuntimeOptions())
    await asyncio.to_thread(registry.discover)
    await registry.load_all(["simple", "broken"])  # explicit mode: the rest stay unloaded on purpose
    try:
        line = DataPlane(registry, control_mode="explicit").status_line()
        assert line == "1 models ready, 0 loading/tuning, 1 failed, 2 not loaded"
    finally:
        await registry.close(5)
