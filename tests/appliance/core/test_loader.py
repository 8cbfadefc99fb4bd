"""The loader serves the plan selection chose: its backend, and on the CPU its instances and threads."""

from __future__ import annotations

import asyncio

import pytest

import hardware_probe
from appliance.backends import RuntimeOptions
from appliance.core.config import config_to_json
from appliance.core.loader import load_model
from appliance.selection import Hardware, SelectionSettings, Selector
from tests.builders import cnn_model, write_model


@pytest.fixture(scope="module")
def selector():
    report = hardware_probe.probe(timeout=30)
    return Selector(Hardware.of(report), None, SelectionSettings(budget=0.02))


def _served(model_dir, selector):
    loaded = load_model(model_dir, RuntimeOptions(), selector)
    model = loaded.versions[1]
    asyncio.run(model.close())
    return model


def test_the_chosen_instance_count_is_what_serves_and_what_the_config_says(tmp_path, selector):
    model = _served(write_model(tmp_path, "cnn", cnn_model()), selector)
    plan = model.selection["plan"]
    assert plan["instances"] >= 1 and "@" in plan["plan"]
    assert model.scheduler.pool.size == plan["instances"]
    assert sum(group["count"] for group in config_to_json(model.config)["instance_group"]) == plan["instances"]


def test_an_explicit_instance_group_serves_as_written(tmp_path, selector):
    model = _served(write_model(tmp_path, "cnn", cnn_model(), config="instance_group [ { count: 1 kind: KIND_CPU } ]"),
                    selector)
    assert all(c.get("instances") in (0, None) for c in model.selection["candidates"])
    assert model.scheduler.pool.size == 1
