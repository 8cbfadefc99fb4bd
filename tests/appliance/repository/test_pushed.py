"""Pushed models (the load API's file overrides): names confined, sizes bounded, nothing left on disk by
a refused or failed push, a new push served without downtime, kept across a restart as an overlay of
the repository, and forgotten by an unload (or by a plain load of the repository's model)."""

from __future__ import annotations

import asyncio
import base64
import errno

import pytest

from appliance.backends import RuntimeOptions
from appliance.core.errors import (
    ConfigError,
    InsufficientStorage,
    InvalidInput,
    PayloadTooLarge,
    PushRefused,
    Unavailable,
)
from appliance.protocol.dataplane import DataPlane, Rules
from appliance.repository.config import config_from_json
from appliance.repository.pushed import PushLimits, PushStore, file_parameters
from appliance.repository.registry import ModelRegistry
from tests.builders import affine_model, write_model
from tests.waiting import next_turn

LIMITS = PushLimits(max_file_bytes=1 << 20, max_total_bytes=3 << 20)


def _onnx(scale: float) -> str:
    model = affine_model(scale, 0)
    model.ir_version = 8
    return base64.b64encode(model.SerializeToString()).decode()


def _push(scale: float, version: int = 1, **extra: str) -> dict[str, str]:
    return {"config": '{"backend": "onnxruntime", "max_batch_size": 4}', f"file:{version}/model.onnx": _onnx(scale),
            **extra}


def _files_on_disk(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize("name", [
    "../1/model.onnx", "1/../../x", "/etc/passwd", "1//model.onnx", "./1/model.onnx", "1/.hidden", "",
    "01/model.onnx", "abc/model.onnx", "1\\model.onnx", "config.pbtxt", "1/a\0b", "1/" + "x" * 200,
    "/".join(["1"] + ["d"] * 9 + ["f"]),
])
def test_names_that_leave_the_model_directory_or_are_not_plain_are_refused(name):
    with pytest.raises(InvalidInput):
        file_parameters({f"file:{name}": "AAAA"}, LIMITS.max_file_bytes)


def test_accepted_names_and_encodings():
    files = file_parameters({"file:1/model.onnx": "AAAA", "file:2/sub/x.bin": b"\x00\x01", "file:labels.txt": "YQ==",
                             "file:warmup/in.raw": "", "config": "{}"}, LIMITS.max_file_bytes)
    assert files == {"1/model.onnx": b"\x00\x00\x00", "2/sub/x.bin": b"\x00\x01", "labels.txt": b"a",
                     "warmup/in.raw": b""}


def test_sizes_and_encodings_are_checked():
    with pytest.raises(PayloadTooLarge, match="push_max_file_bytes"):
        file_parameters({"file:1/model.onnx": base64.b64encode(b"x" * 2000).decode()}, 1000)
    with pytest.raises(PayloadTooLarge, match="push_max_file_bytes"):
        file_parameters({"file:1/model.onnx": b"x" * 1001}, 1000)
    with pytest.raises(InvalidInput, match="not base64"):
        file_parameters({"file:1/model.onnx": "not base64!"}, 1000)
    with pytest.raises(InvalidInput, match="both a file and a directory"):
        file_parameters({"file:1/a": "AAAA", "file:1/a/b": "AAAA"}, 1000)


def test_the_store_bounds_all_pushed_bytes_and_leaves_nothing_when_refused(tmp_path):
    store = PushStore(tmp_path / "pushed", PushLimits(100, 250))
    config = config_from_json("{}", "a")
    staged = store.stage("a", config, {"1/model.onnx": b"x" * 100})
    store.commit(staged)
    store.commit(store.stage("b", config_from_json("{}", "b"), {"1/model.onnx": b"x" * 100}))
    with pytest.raises(PayloadTooLarge, match="push_max_total_bytes"):
        store.stage("c", config_from_json("{}", "c"), {"1/model.onnx": b"x" * 100})
    replaced = store.commit(store.stage("a", config, {"1/model.onnx": b"y" * 100}))  # replacing does not add
    assert replaced == staged.generation
    store.remove_generation(replaced)
    assert len(list((tmp_path / "pushed").iterdir())) == 2


def test_a_half_written_push_is_removed_at_open_and_the_newest_wins(tmp_path):
    root = tmp_path / "pushed"
    store = PushStore(root, LIMITS)
    config = config_from_json("{}", "m")
    first = store.stage("m", config, {"1/model.onnx": b"1"})
    store.commit(first)
    second = store.stage("m", config, {"1/model.onnx": b"2"})
    store.commit(second)  # the first one left behind, as after a crash before its removal
    unfinished = store.stage("m", config, {"1/model.onnx": b"3"})  # never committed
    reopened = PushStore(root, LIMITS)
    assert reopened.open() == {"m": second.model_dir}
    assert not first.generation.exists() and not unfinished.generation.exists()
    assert (second.model_dir / "1" / "model.onnx").read_bytes() == b"2"
    assert reopened.origin("m")["origin"] == "pushed" and reopened.origin("m")["files"] == {"1/model.onnx": 1}


@pytest.fixture
async def fleet_box(tmp_path):
    """A repository with 'affine' (x * 2); pushes kept in tmp_path/state/pushed; explicit mode."""
    repo = tmp_path / "repo"
    write_model(repo, "affine", affine_model(2, 0))
    made = []

    async def make() -> DataPlane:
        store = PushStore(tmp_path / "state" / "pushed", LIMITS)
        await asyncio.to_thread(store.open)
        registry = ModelRegistry(repo, RuntimeOptions(), overlay=store.model_dirs)
        await registry.load_all(["affine", *store.model_dirs()])
        plane = DataPlane(registry, Rules(control_mode="explicit"), pushes=store)
        plane.mark_loaded()
        made.append(registry)
        return plane

    yield make, tmp_path / "state" / "pushed"
    for registry in made:
        await registry.close(5)


async def test_a_push_is_served_listed_as_pushed_and_kept_across_a_restart(fleet_box):
    make, root = fleet_box
    plane = await make()
    await plane.load_model("new", _push(3))
    assert plane.model_ready("new")
    rows = {r.name: r for r in plane.repository_index()}
    assert rows["new"].origin == "pushed" and rows["affine"].origin == "repository"
    assert plane.model_config("new").max_batch_size == 4
    again = await make()  # a restart: the overlay is read from the state dir
    assert again.model_ready("new")
    assert {r.name: r.origin for r in again.repository_index()}["new"] == "pushed"
    assert len(list(root.iterdir())) == 1


async def test_a_file_named_from_the_model_directorys_root_is_inside_it(fleet_box):
    """Triton resolves 'file:/1/model.py' in the model's own directory (qa L0_backend_python model_control)."""
    make, root = fleet_box
    plane = await make()
    push = {("file:/" + key[len("file:"):] if key.startswith("file:") else key): value
            for key, value in _push(3).items()}
    assert any(key.startswith("file:/1/") for key in push)
    await plane.load_model("rooted", push)
    assert plane.model_ready("rooted") and plane.model_config("rooted").max_batch_size == 4


async def test_a_push_over_a_repository_model_replaces_it_until_a_plain_load(fleet_box):
    make, root = fleet_box
    plane = await make()
    await plane.load_model("affine", _push(5, version=7))
    assert plane.model_metadata("affine").versions == ("7",)
    assert {r.name: r.origin for r in plane.repository_index()}["affine"] == "pushed"
    await plane.load_model("affine", {})  # as Triton: a load without files serves the repository again
    assert plane.model_metadata("affine").versions == ("1",)
    assert {r.name: r.origin for r in plane.repository_index()}["affine"] == "repository"
    assert _files_on_disk(root) == []


async def test_a_new_push_loads_beside_the_serving_one_without_downtime(fleet_box):
    make, root = fleet_box
    plane = await make()
    await plane.load_model("m", _push(3, version=1))
    served = []
    stop = asyncio.Event()

    async def keep_asking() -> None:
        while not stop.is_set():
            served.append(plane.model_ready("m"))
            await next_turn()

    asker = asyncio.create_task(keep_asking())
    await plane.load_model("m", _push(4, version=2))
    stop.set()
    await asker
    assert served and all(served)
    assert plane.model_metadata("m").versions == ("2",)
    assert [p.name for p in root.iterdir()] and len(list(root.iterdir())) == 1  # the old generation is gone


async def test_refused_and_failed_pushes_leave_nothing(fleet_box):
    make, root = fleet_box
    plane = await make()
    with pytest.raises(InvalidInput, match="'config' parameter"):
        await plane.load_model("m", {"file:1/model.onnx": _onnx(1)})
    with pytest.raises(InvalidInput, match="must be a version number"):  # the model's tmp/x, not /tmp/x
        await plane.load_model("m", {"config": "{}", "file:/tmp/x": "AAAA"})
    with pytest.raises(InvalidInput, match="plain name"):
        await plane.load_model("m", {"config": "{}", "file:/../../x": "AAAA"})
    with pytest.raises(InvalidInput, match="name a file"):
        await plane.load_model("m", {"config": "{}", "file:///": "AAAA"})
    with pytest.raises(InvalidInput, match="plain name"):
        await plane.load_model("m", {"config": "{}", "file:1/../../x": "AAAA"})
    with pytest.raises(InvalidInput, match="no version directory"):
        await plane.load_model("m", {"config": "{}", "file:labels.txt": "AAAA"})
    with pytest.raises(PayloadTooLarge):
        await plane.load_model("m", {"config": "{}", "file:1/model.onnx": base64.b64encode(b"x" * (2 << 20)).decode()})
    with pytest.raises(ConfigError, match="failed to load 'm'"):  # not an ONNX file: staged, failed, removed
        await plane.load_model("m", {"config": '{"backend": "onnxruntime"}', "file:1/model.onnx": "AAAA"})
    assert _files_on_disk(root) == [] and list(root.iterdir()) == []
    assert "m" not in {r.name for r in plane.repository_index()}


async def test_an_unload_removes_the_pushed_files(fleet_box):
    make, root = fleet_box
    plane = await make()
    await plane.load_model("m", _push(3))
    await plane.unload_model("m")
    assert _files_on_disk(root) == []
    assert "m" not in {r.name for r in plane.repository_index()}
    again = await make()
    assert "m" not in {r.name for r in again.repository_index()}


async def test_unloading_a_push_over_a_repository_model_serves_the_repository_again_in_mode_none(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "affine", affine_model(2, 0))
    store = PushStore(tmp_path / "pushed", LIMITS)
    registry = ModelRegistry(repo, RuntimeOptions(), overlay=store.model_dirs)
    await registry.load_all()
    plane = DataPlane(registry, Rules(control_mode="none"), pushes=store)
    plane.mark_loaded()
    try:
        await plane.load_model("affine", _push(5, version=3))  # a push is accepted in mode none
        assert plane.model_metadata("affine").versions == ("3",)
        with pytest.raises(Unavailable, match="--model-control-mode explicit"):
            await plane.load_model("affine", {})  # a plain load is not, as in Triton
        await plane.unload_model("affine")  # an unload of a pushed model is
        assert plane.model_metadata("affine").versions == ("1",)
        assert {r.name: r.origin for r in plane.repository_index()}["affine"] == "repository"
    finally:
        await registry.close(5)


@pytest.mark.parametrize("name", ["origin.json", ".origin.json.tmp", ".hidden"])
async def test_names_the_store_keeps_for_itself_are_refused(fleet_box, name):
    """Issue 22 (Low): a push named origin.json answered 500 yet was READY, and the restart deleted it."""
    make, root = fleet_box
    plane = await make()
    with pytest.raises(PushRefused, match="the pushed-model store's own"):
        await plane.load_model(name, _push(3))
    assert _files_on_disk(root) == [] and name not in {r.name for r in plane.repository_index()}


async def test_a_push_onto_a_full_disk_is_507_and_leaves_nothing(fleet_box, monkeypatch):
    """Issue 22 (Low): a push onto a full disk answered 500; it is the box's state, said as 507."""
    make, root = fleet_box
    plane = await make()
    real = PushStore._write

    def full(model_dir, relative, data):
        if relative.endswith("model.onnx"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(model_dir, relative, data)

    monkeypatch.setattr(PushStore, "_write", staticmethod(full))
    with pytest.raises(InsufficientStorage, match="is full") as excinfo:
        await plane.load_model("m", _push(3))
    assert excinfo.value.status == 507 and "push again" in excinfo.value.message
    assert _files_on_disk(root) == [] and "m" not in {r.name for r in plane.repository_index()}
