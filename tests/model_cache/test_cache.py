from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from model_cache import ModelCache, cache_key, hash_files


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
