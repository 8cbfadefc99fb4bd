"""The loader on its own: which versions load, how one failing version is reported, configs and
instance counts, and serving the plan selection chose (its backend, instances and threads)."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.grpc import model_config_pb2 as mc

import hardware_probe
from appliance.backends import RuntimeOptions
from appliance.core.errors import ConfigError
from appliance.repository.config import config_from_json, config_to_json
from appliance.repository.loader import LoadedModel, load_model, version_dirs
from appliance.selection import Hardware, SelectionSettings, Selector
from tests.builders import cnn_model, identity_model, save, write_model


@pytest.fixture(scope="module")
def selector():
    report = hardware_probe.probe(timeout=30)
    return Selector(Hardware.of(report), None, SelectionSettings(budget=0.02))


@pytest.fixture
def load():
    """load(model_dir, selector=None, **kwargs) -> LoadedModel; every version it loads is closed after."""
    loaded: list[LoadedModel] = []

    def load_(model_dir, selector=None, **kwargs) -> LoadedModel:
        loaded.append(load_model(model_dir, RuntimeOptions(), selector, **kwargs))
        return loaded[-1]

    yield load_
    for model in loaded:
        for version in model.versions.values():
            asyncio.run(version.close())


@pytest.fixture
def versions(tmp_path):
    """A model "m" with versions 1..3 of an FP32 identity model (config text optional)."""

    def write(config: str | None = None, broken: tuple[int, ...] = ()):
        for version in (1, 2, 3):
            write_model(tmp_path, "m", identity_model(["FP32"]), version, config)
            if version in broken:
                (tmp_path / "m" / str(version) / "model.onnx").write_bytes(b"not onnx")
        return tmp_path / "m"

    return write


def test_the_newest_version_serves_unless_the_version_policy_asks_for_others(load, versions):
    assert sorted(load(versions()).versions) == [3]
    assert sorted(load(versions("version_policy: { all {} }")).versions) == [1, 2, 3]
    assert sorted(load(versions("version_policy: { latest { num_versions: 2 } }")).versions) == [2, 3]
    assert sorted(load(versions("version_policy: { specific { versions: [1, 3] } }")).versions) == [1, 3]


def test_a_version_that_cannot_load_fails_alone(load, versions):
    loaded = load(versions("version_policy: { all {} }", broken=(2,)))
    assert sorted(loaded.versions) == [1, 3] and list(loaded.failures) == [2]
    assert "onnxruntime cannot load" in loaded.failures[2]
    assert [t.name for t in loaded.config.input] == ["IN_FP32"]  # completed by the newest version


def test_a_model_no_version_of_which_loads_names_each_reason(load, versions):
    with pytest.raises(ConfigError, match=r"'m' has no loadable version \(version 3: .*onnxruntime cannot load"):
        load(versions(broken=(3,)))


def test_a_model_without_version_directories_says_where_its_file_goes(load, tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="expected m/1/<model file>"):
        load(tmp_path / "m")


def test_a_version_without_its_model_file_names_the_path_expected(load, tmp_path):
    save(identity_model(["FP32"]), tmp_path / "m" / "1" / "model.onnx.bak")
    (tmp_path / "m" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    with pytest.raises(ConfigError, match="has no model.onnx; expected m/1/model.onnx"):
        load(tmp_path / "m")


def test_version_directories_are_positive_integers_without_leading_zeros(tmp_path):
    for name in ("1", "2", "10", "01", "0", "v3", "x"):
        (tmp_path / name).mkdir()
    (tmp_path / "4").write_text("a file, not a version")
    assert sorted(version_dirs(tmp_path)) == [1, 2, 10]


def test_a_config_override_replaces_config_pbtxt(load, versions):
    model_dir = versions("max_batch_size: 4")
    override = config_from_json({"max_batch_size": 2}, "m")
    loaded = load(model_dir, config_override=override)
    assert loaded.config.max_batch_size == 2 and loaded.versions[3].signature.max_batch_size == 2
    assert load(model_dir).config.max_batch_size == 4


def test_instances_follow_the_instance_group_and_default_to_two_for_onnxruntime(load, versions):
    assert load(versions()).versions[3].scheduler.pool.size == 2  # Triton's default for onnxruntime
    loaded = load(versions("instance_group [ { count: 3 kind: KIND_CPU } ]"))
    assert loaded.versions[3].scheduler.pool.size == 3
    assert [(g.count, g.kind) for g in loaded.config.instance_group] == [(3, mc.ModelInstanceGroup.KIND_CPU)]


def test_the_chosen_instance_count_is_what_serves_and_what_the_config_says(tmp_path, selector, load):
    model = load(write_model(tmp_path, "cnn", cnn_model()), selector).versions[1]
    plan = model.selection["plan"]
    assert plan["instances"] >= 1 and "@" in plan["plan"]
    assert model.scheduler.pool.size == plan["instances"]
    assert sum(group["count"] for group in config_to_json(model.config)["instance_group"]) == plan["instances"]


def test_an_explicit_instance_group_serves_as_written(tmp_path, selector, load):
    config = "instance_group [ { count: 1 kind: KIND_CPU } ]"
    model = load(write_model(tmp_path, "cnn", cnn_model(), config=config), selector).versions[1]
    assert all(c.get("instances") in (0, None) for c in model.selection["candidates"])
    assert model.scheduler.pool.size == 1


def test_measured_instances_keep_the_instance_groups_rate_limiter(tmp_path, selector, load):
    config = ('instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "npu" count: 1 } ] '
              'priority: 3 } } ]\nparameters { key: "tune_instances" value: { string_value: "true" } }')
    model = load(write_model(tmp_path, "cnn", cnn_model(), config=config), selector).versions[1]
    groups = config_to_json(model.config)["instance_group"]
    assert sum(group["count"] for group in groups) == model.selection["plan"]["instances"]
    assert all(group["rate_limiter"] == {"resources": [{"name": "npu", "global": False, "count": 1}], "priority": 3}
               for group in groups)


def test_a_decoupled_onnx_model_fails_to_load_with_the_reason(load, versions):
    model_dir = versions('platform: "onnxruntime_onnx" model_transaction_policy { decoupled: true }')
    with pytest.raises(ConfigError, match="the onnxruntime backend cannot serve decoupled models"):
        load(model_dir)
