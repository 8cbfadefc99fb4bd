from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from model_cache import CacheReadOnly, ModelCache, cache_key, hash_files


def _artefacts(tmp_path: Path, size: int = 1000, name: str = "a") -> Path:
    folder = tmp_path / f"artefacts-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blob.bin").write_bytes(b"x" * size)
    return folder


def test_store_then_lookup_is_a_hit(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    cache.store("k1", {"chosen": "openvino:CPU"}, _artefacts(tmp_path))
    entry = cache.lookup("k1")
    assert entry is not None and entry.decision == {"chosen": "openvino:CPU"}
    assert (entry.artefacts / "blob.bin").read_bytes() == b"x" * 1000
    assert cache.lookup("other") is None


def test_truncated_artefact_is_detected_and_discarded(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    entry = cache.store("k1", {"chosen": "p"}, _artefacts(tmp_path))
    blob = entry.artefacts / "blob.bin"
    blob.write_bytes(blob.read_bytes()[:10])
    assert cache.lookup("k1") is None
    assert not entry.path.exists()  # discarded, to be rebuilt


def test_blobs_a_runtime_adds_to_artefacts_keep_the_entry(tmp_path):
    """OpenVINO writes compiled blobs into its CACHE_DIR (the entry's artefacts) while serving: the next
    start must still find the entry (it once re-tuned every model OpenVINO served, at every start)."""
    cache = ModelCache(tmp_path / "cache")
    entry = cache.store("k1", {"chosen": "openvino:CPU"}, _artefacts(tmp_path))
    (entry.artefacts / "1234.blob").write_bytes(b"compiled while serving")
    assert cache.lookup("k1") is not None
    (entry.path / "stray.json").write_text("{}")  # outside artefacts/: not the runtime's
    assert cache.lookup("k1") is None


def test_partial_entry_is_never_loaded(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    entry = cache.store("k1", {"chosen": "p"})
    (entry.path / "manifest.json").unlink()
    assert cache.lookup("k1") is None
    entry = cache.store("k2", {"chosen": "p"})
    (entry.path / "decision.json").write_text(json.dumps({"chosen": "tampered"}))
    assert cache.lookup("k2") is None


def test_least_recently_used_entries_are_evicted(tmp_path):
    cache = ModelCache(tmp_path / "cache", max_bytes=2500)
    cache.store("old", {"n": 1}, _artefacts(tmp_path, 1000, "1"))
    cache.store("mid", {"n": 2}, _artefacts(tmp_path, 1000, "2"))
    assert cache.lookup("old") is not None  # "old" is now the most recently used
    cache.store("new", {"n": 3}, _artefacts(tmp_path, 1000, "3"))
    assert {e.key for e in cache.entries()} == {"old", "new"}


def test_key_changes_with_the_model_file_and_the_hardware(tmp_path):
    model = tmp_path / "1"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"weights")
    before = cache_key(hash_files(model), fingerprint="a", runtimes={"onnxruntime": "1"})
    (model / "model.onnx").write_bytes(b"weights!")
    after = cache_key(hash_files(model), fingerprint="a", runtimes={"onnxruntime": "1"})
    assert before != after
    assert after != cache_key(hash_files(model), fingerprint="b", runtimes={"onnxruntime": "1"})
    assert after != cache_key(hash_files(model), fingerprint="a", runtimes={"onnxruntime": "2"})
    assert after == cache_key(hash_files(model), fingerprint="a", runtimes={"onnxruntime": "1"})


def _writer(root: str, worker: int) -> None:
    cache = ModelCache(Path(root))
    scratch = Path(root).parent / f"scratch-{worker}"
    for i in range(8):
        folder = _artefacts(scratch, 2000 + i, str(i))
        cache.store(f"shared-{i % 3}", {"worker": worker, "i": i}, folder)
        cache.store(f"own-{worker}-{i}", {"worker": worker}, folder)


def test_concurrent_writers_do_not_corrupt_the_cache(tmp_path):
    root = tmp_path / "cache"
    ModelCache(root)
    processes = [multiprocessing.get_context("spawn").Process(target=_writer, args=(str(root), w)) for w in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    cache = ModelCache(root)
    keys = {e.key for e in cache.entries()}
    assert {f"shared-{i}" for i in range(3)} <= keys and len(keys) == 3 + 4 * 8
    assert all(cache.lookup(key) is not None for key in keys)  # every entry verifies
    assert not list((root / ".staging").iterdir())  # no half-written leftovers


def test_clear(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    cache.store("a", {})
    cache.store("b", {})
    assert cache.clear() == 2 and cache.entries() == []


WRONG_SHAPES = {
    "a list": [],
    "a string": "manifest",
    "no files": {"key": "k", "size": 10},
    "files not an object": {"files": 3, "size": 10},
    "size not a number": {"files": {}, "size": None},
}


@pytest.mark.parametrize("manifest", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_a_manifest_of_the_wrong_shape_is_a_miss_and_is_removed(tmp_path, manifest):
    cache = ModelCache(tmp_path / "cache")
    entry = cache.store("k1", {"chosen": "p"})
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    assert cache.entries() == []
    assert [b.key for b in cache.broken()] == ["k1"]
    assert cache.lookup("k1") is None
    assert not entry.path.exists()


@pytest.mark.parametrize("decision", [[], "chosen", 7, None], ids=repr)
def test_a_decision_that_is_not_an_object_is_a_miss(tmp_path, decision):
    cache = ModelCache(tmp_path / "cache")
    cache.store("k1", decision)  # the manifest matches: only the shape is wrong
    assert cache.lookup("k1") is None
    assert cache.entries() == []


def _broken_entry(root: Path, key: str, manifest: object) -> Path:
    path = root / key
    (path / "artefacts").mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "decision.json").write_text("{}")
    return path


def test_broken_entries_are_listed_and_cleared(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    cache.store("good", {"chosen": "p"})
    _broken_entry(cache.root, "wrong-shape", [1, 2])
    _broken_entry(cache.root, "not-json", {}).joinpath("manifest.json").write_bytes(b"\x00\xff{")
    (cache.root / "half").mkdir()  # no manifest at all
    assert [e.key for e in cache.entries()] == ["good"]
    reasons = {b.key: b.reason for b in cache.broken()}
    assert set(reasons) == {"wrong-shape", "not-json", "half"}
    assert "not an object" in reasons["wrong-shape"] and "manifest.json" in reasons["half"]
    assert cache.clear() == 4
    assert cache.entries() == [] and cache.broken() == []


def test_eviction_works_with_broken_entries_and_removes_them(tmp_path):
    heard = []
    cache = ModelCache(tmp_path / "cache", max_bytes=2500, on_broken=heard.append)
    cache.store("old", {"n": 1}, _artefacts(tmp_path, 1000, "1"))
    _broken_entry(cache.root, "broken", {"files": "x"})
    cache.store("mid", {"n": 2}, _artefacts(tmp_path, 1000, "2"))
    cache.store("new", {"n": 3}, _artefacts(tmp_path, 1000, "3"))
    assert {e.key for e in cache.entries()} == {"mid", "new"}
    assert cache.broken() == []
    assert [(b.key, b.removed) for b in heard] == [("broken", True)]


def test_a_lookup_reports_the_broken_entry_it_met(tmp_path):
    heard = []
    cache = ModelCache(tmp_path / "cache", on_broken=heard.append)
    _broken_entry(cache.root, "k1", {"files": {}, "size": "big"})
    assert cache.lookup("k1") is None
    assert [(b.key, b.removed) for b in heard] == [("k1", True)]
    assert "size" in heard[0].reason


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_a_read_only_cache_serves_hits_and_writes_nothing(tmp_path):
    writer = ModelCache(tmp_path / "cache")
    writer.store("k1", {"chosen": "p"}, _artefacts(tmp_path))
    _broken_entry(writer.root, "broken", [])
    before = _snapshot(writer.root)
    heard = []
    cache = ModelCache(writer.root, writable=False, on_broken=heard.append)
    entry = cache.lookup("k1")
    assert entry is not None and entry.decision == {"chosen": "p"}
    assert cache.lookup("broken") is None
    assert [(b.key, b.removed) for b in heard] == [("broken", False)]  # a miss, left in place
    with cache.staging() as staging:
        assert writer.root not in staging.parents
    with pytest.raises(CacheReadOnly):
        cache.store("k2", {"chosen": "q"})
    with pytest.raises(CacheReadOnly):
        cache.clear()
    assert _snapshot(writer.root) == before  # not even .last_used or the lock file changed


def test_a_read_only_cache_that_does_not_exist_is_empty(tmp_path):
    cache = ModelCache(tmp_path / "never-created", writable=False)
    assert cache.lookup("k1") is None
    assert cache.entries() == [] and cache.broken() == []
    assert not cache.root.exists()
