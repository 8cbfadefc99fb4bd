"""The model registry on its own: discovery, loads that fail, lookups for the request path, reloads
without downtime, rescans and unloads, and the events the metrics history records."""

from __future__ import annotations

import os
import shutil

import pytest

from appliance.backends import RuntimeOptions
from appliance.core.errors import ConfigError, InvalidInput, ModelNotFound
from appliance.repository.registry import NOT_LOADED, ModelRegistry, ModelState
from tests.builders import identity_model, write_model


@pytest.fixture
def repo(tmp_path):
    """Two good models ("a" with versions 1 and 2, "b") and one that cannot load ("broken")."""
    root = tmp_path / "repo"
    for version in (1, 2):
        write_model(root, "a", identity_model(["FP32"]), version, "version_policy: { all {} }")
    write_model(root, "b", identity_model(["INT32"]))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    return root


@pytest.fixture
def events() -> list[tuple]:
    """What the registries tell the metrics history: (kind, model, version, detail)."""
    return []


@pytest.fixture
async def make_registry(events):
    """make_registry(repo) -> ModelRegistry reporting to ``events``; every registry is closed after."""
    made: list[ModelRegistry] = []

    def make(repository) -> ModelRegistry:
        made.append(ModelRegistry(repository, RuntimeOptions(), drain_timeout=2,
                                  on_event=lambda *event: events.append(event)))
        return made[-1]

    yield make
    for registry in made:
        await registry.close(5)


def test_discovery_lists_plainly_named_directories_only(repo):
    (repo / ".hidden").mkdir()
    (repo / "notes.txt").write_text("not a model")
    (repo / "bad name").mkdir()
    registry = ModelRegistry(repo, RuntimeOptions())
    assert [p.name for p in registry.discover()] == ["a", "b", "broken"]
    assert {e.name: e.state for e in registry.entries()} == dict.fromkeys(("a", "b", "broken"), ModelState.LOADING)


def test_a_missing_repository_says_which_flag_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="--model-repository"):
        ModelRegistry(tmp_path / "nowhere", RuntimeOptions()).scan()


async def test_load_all_readies_the_good_models_and_records_why_the_others_failed(repo, make_registry, events):
    registry = make_registry(repo)
    await registry.load_all()
    states = {e.name: (e.state, e.reason) for e in registry.entries()}
    assert states["a"] == (ModelState.READY, "") and states["b"] == (ModelState.READY, "")
    assert states["broken"][0] is ModelState.UNAVAILABLE and "onnxruntime cannot load" in states["broken"][1]
    assert registry.ready_count() == 2 and not registry.all_ready
    assert [(m.name, m.version) for m in registry.ready_versions()] == [("a", 1), ("a", 2), ("b", 1)]
    kinds = {(kind, model) for kind, model, _, _ in events}
    assert {("model_loaded", "a"), ("model_loaded", "b"), ("model_failed", "broken")} <= kinds


async def test_models_left_out_of_an_explicit_load_are_not_loaded_nor_failed(repo, make_registry):
    registry = make_registry(repo)
    await registry.load_all(["b"])
    a = registry.entry("a")
    assert (a.state, a.reason, a.wanted) == (ModelState.UNAVAILABLE, NOT_LOADED, False)
    assert not registry.entry("broken").wanted
    assert registry.all_ready  # only the wanted models count


async def test_lookups_name_what_is_there(repo, make_registry):
    registry = make_registry(repo)
    await registry.load_all()
    assert registry.get("a").version == 2 and registry.get("a", "1").version == 1
    with pytest.raises(ModelNotFound, match=r"version 7 is not found; available versions: \[1, 2\]"):
        registry.get("a", "7")
    with pytest.raises(ModelNotFound, match="unknown model: 'nope'"):
        registry.get("nope")
    with pytest.raises(ModelNotFound, match="'broken' has no available versions; .*onnxruntime cannot load"):
        registry.get("broken")
    with pytest.raises(InvalidInput, match="positive integer"):
        registry.get("a", "²")


def test_model_names_cannot_leave_the_repository(repo, tmp_path):
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", repo / "link")
    registry = ModelRegistry(repo, RuntimeOptions())
    for name in ("..", "a/../../x", "a b", "x" * 256):
        with pytest.raises(InvalidInput, match="invalid model name"):
            registry.model_dir(name)
    with pytest.raises(InvalidInput, match="outside the model repository"):
        registry.model_dir("link")
    assert "link" not in [p.name for p in registry.scan()]


async def test_loading_an_unknown_model_or_a_broken_one_raises(repo, make_registry):
    registry = make_registry(repo)
    with pytest.raises(ModelNotFound, match="no such model"):
        await registry.load("nope")
    with pytest.raises(ConfigError, match="onnxruntime cannot load"):
        await registry.load("broken")
    entry = await registry.load("broken", raise_errors=False)
    assert entry.state is ModelState.UNAVAILABLE


async def test_a_failed_reload_keeps_the_previous_versions_serving(repo, make_registry):
    registry = make_registry(repo)
    await registry.load("b")
    serving = registry.get("b")
    (repo / "b" / "1" / "model.onnx").write_bytes(b"broken now")
    entry = await registry.load("b", raise_errors=False)
    assert entry.state is ModelState.READY and registry.get("b") is serving
    assert entry.reason.startswith("reload failed, still serving the previous load")


async def test_a_reload_switches_to_new_versions_and_retires_the_old(repo, make_registry, events):
    registry = make_registry(repo)
    await registry.load("b")
    old = registry.get("b")
    await registry.load("b")
    assert registry.get("b") is not old
    assert ("model_unloaded", "b", 1, {"reason": "replaced by a new load"}) in events


async def test_unload_stops_routing_and_frees_the_model(repo, make_registry):
    registry = make_registry(repo)
    await registry.load("b")
    await registry.unload("b")
    entry = registry.entry("b")
    assert (entry.state, entry.wanted, entry.versions) == (ModelState.UNAVAILABLE, False, {})
    with pytest.raises(ModelNotFound, match="'b' has no available versions; unloaded"):
        registry.get("b")


async def test_rescan_loads_new_models_reloads_changed_ones_and_unloads_removed_ones(repo, make_registry):
    registry = make_registry(repo)
    await registry.load_all(["a", "b"])
    write_model(repo, "c", identity_model(["INT64"]))
    changed = repo / "b" / "1" / "model.onnx"
    before = changed.stat().st_mtime_ns
    write_model(repo, "b", identity_model(["INT32", "INT64"]))
    later = before + 1_000_000_000  # a new modification time, whatever the file system's time granularity
    os.utime(changed, ns=(later, later))
    shutil.rmtree(repo / "a")
    changes = await registry.rescan()
    assert changes == {"added": ["c"], "removed": ["a"], "reloaded": ["b"]}
    assert list(registry.get("b").signature.inputs) == ["IN_INT32", "IN_INT64"]
    assert registry.get("c").name == "c"
    with pytest.raises(ModelNotFound):
        registry.entry("a")


async def test_a_model_that_failed_to_load_is_tried_again_once_its_files_change(repo, make_registry):
    """Triton never retries a failed model on a re-scan (server#6534); here fixing its files is enough."""
    registry = make_registry(repo)
    (repo / "unparsed").mkdir()
    write_model(repo, "unparsed", identity_model(["FP32"]), config="this is { not a config")
    await registry.load_all(["broken", "unparsed"])
    assert {n: registry.entry(n).state for n in ("broken", "unparsed")} == dict.fromkeys(
        ("broken", "unparsed"), ModelState.UNAVAILABLE)
    assert (await registry.rescan())["reloaded"] == []  # the same files: no retry loop on every poll
    write_model(repo, "broken", identity_model(["FP32"]))
    (repo / "unparsed" / "config.pbtxt").write_text('backend: "onnxruntime"')
    assert await registry.rescan() == {"added": [], "removed": [], "reloaded": ["broken", "unparsed"]}
    assert {n: registry.entry(n).state for n in ("broken", "unparsed")} == dict.fromkeys(
        ("broken", "unparsed"), ModelState.READY)
    assert registry.get("broken").name == "broken"


async def test_a_model_unloaded_on_purpose_is_not_loaded_by_a_rescan(repo, make_registry):
    registry = make_registry(repo)
    await registry.load_all(["b"])
    await registry.unload("b", "unloaded")
    write_model(repo, "b", identity_model(["INT32", "INT64"]))
    assert (await registry.rescan())["reloaded"] == []
    assert registry.entry("b").state is ModelState.UNAVAILABLE


async def test_close_frees_every_version_and_says_why(repo, make_registry):
    registry = make_registry(repo)
    await registry.load_all(["a"])
    assert await registry.close(5) == []
    entry = registry.entry("a")
    assert (entry.state, entry.reason, entry.versions) == (ModelState.UNAVAILABLE, "server is shutting down", {})
