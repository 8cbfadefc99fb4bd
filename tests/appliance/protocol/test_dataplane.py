"""The data plane's view of the registry, without any transport: what every front end asks of the server."""

from __future__ import annotations

import asyncio

import pytest

from appliance import __version__
from appliance.backends import RuntimeOptions
from appliance.errors import ConfigError, InvalidInput, ModelNotFound, ModelNotReady, NotSupported
from appliance.examples import build_example_repository
from appliance.protocol.dataplane import SERVER_NAME, DataPlane
from appliance.repository.registry import ModelRegistry


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example repository (simple, simple_string, mlp) and a model that cannot load."""
    repo = build_example_repository(tmp_path_factory.mktemp("example") / "repo")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    return repo


@pytest.fixture
async def registry(example):
    registry = ModelRegistry(example, RuntimeOptions())
    yield registry
    await registry.close(5)


@pytest.fixture
async def plane(registry):
    """Every model loaded (the broken one failed), explicit model control, start-up load finished."""
    await registry.load_all()
    plane = DataPlane(registry, control_mode="explicit")
    plane.mark_loaded()
    return plane


async def test_status_line_does_not_count_models_left_unloaded_as_failed(registry):
    await asyncio.to_thread(registry.discover)
    await registry.load_all(["simple", "broken"])  # explicit mode: the rest stay unloaded on purpose
    line = DataPlane(registry, control_mode="explicit").status_line()
    assert line == "1 models ready, 0 loading/tuning, 1 failed, 2 not loaded"


async def test_ready_once_loaded_and_then_only_when_every_model_is_unless_not_strict(registry):
    await registry.load_all()
    strict, lenient = DataPlane(registry), DataPlane(registry, strict_readiness=False)
    assert not strict.ready() and not lenient.ready()  # the start-up load has not finished
    for plane in (strict, lenient):
        plane.mark_loaded()
    assert lenient.ready() and not strict.ready()  # "broken" failed
    assert strict.live()
    strict.fail("the repository load died")
    assert not strict.live() and strict.failure == "the repository load died"


async def test_server_and_model_metadata(plane):
    server = plane.server_metadata()
    assert server["name"] == SERVER_NAME and server["version"] == __version__
    metadata = plane.model_metadata("simple")
    assert metadata["versions"] == ["1"] and metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                                  {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]
    assert plane.model_ready("simple") and not plane.model_ready("broken")
    with pytest.raises(ModelNotReady):
        plane.model_metadata("broken")


async def test_model_config_is_triton_json_and_auto_completed(plane):
    config = plane.model_config("mlp")  # no config.pbtxt: completed from the model
    assert config["name"] == "mlp" and config["backend"] == "onnxruntime"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("input", "TYPE_FP32", [784])]


async def test_statistics_of_every_version_one_model_or_one_version(plane):
    names = [row["name"] for row in plane.model_statistics()["model_stats"]]
    assert names == ["mlp", "simple", "simple_string"]
    (row,) = plane.model_statistics("simple")["model_stats"]
    assert row["version"] == "1" and row["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert plane.model_statistics("simple", "1") == plane.model_statistics("simple")
    with pytest.raises(ModelNotFound):
        plane.model_statistics("nope")


async def test_selection_off_says_what_serves(plane):
    selection = plane.model_selection("simple")
    assert selection["status"] == "off" and "--no-selection" in selection["reason"]


async def test_model_control_needs_explicit_mode(registry):
    await registry.load_all()
    plane = DataPlane(registry, control_mode="none")
    with pytest.raises(InvalidInput, match="--model-control-mode explicit"):
        await plane.load_model("simple", {})
    with pytest.raises(InvalidInput, match="explicit model unload is not allowed"):
        await plane.unload_model("simple")


async def test_load_with_a_config_override_and_what_a_load_refuses(plane):
    await plane.load_model("simple", {"config": '{"max_batch_size": 2}'})
    assert plane.model_config("simple")["max_batch_size"] == 2
    with pytest.raises(NotSupported, match="keeps no pushed models"):  # no PushStore: see test_pushed.py
        await plane.load_model("simple", {"file:1/model.onnx": "AAAA"})
    with pytest.raises(ConfigError, match="'simple'"):
        await plane.load_model("simple", {"config": "{not json"})
    with pytest.raises(InvalidInput, match="invalid model name"):
        await plane.load_model("../simple", {})
    assert plane.model_config("simple")["max_batch_size"] == 2  # the refused loads changed nothing


async def test_repository_index_after_an_unload(plane):
    await plane.unload_model("simple_string")
    rows = {row["name"]: row for row in plane.repository_index()}
    assert rows["simple"] == {"name": "simple", "version": "1", "state": "READY", "reason": "", "origin": "repository"}
    assert rows["simple_string"] == {"name": "simple_string", "state": "UNAVAILABLE", "reason": "unloaded",
                                     "origin": "repository"}
    assert rows["broken"]["state"] == "UNAVAILABLE" and "onnxruntime cannot load" in rows["broken"]["reason"]
    assert [row["name"] for row in plane.repository_index(ready_only=True)] == ["mlp", "simple"]
