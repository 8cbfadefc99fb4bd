"""A directory of cache entries, one per (model files, plan options, hardware, runtime versions).

Each entry is ``<root>/<key>/`` with ``decision.json`` (the chosen plan and its measurements),
``artefacts/`` (compiled blobs a runtime reuses) and ``manifest.json`` (sha256 of every file). Entries
are written into a staging directory and renamed into place, so a reader sees a whole entry or none; a
manifest that does not match its files marks a corrupt entry, which is discarded and rebuilt, never
loaded. Writers serialise on a file lock, so two daemons (or a daemon and ``appliance tune``) can
share a cache. The total size is bounded: the least recently used entries go first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CacheEntry", "ModelCache", "cache_key", "hash_files"]

_MANIFEST = "manifest.json"
_DECISION = "decision.json"
_ARTEFACTS = "artefacts"
_LAST_USED = ".last_used"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (a model version directory, external data included)."""
    return {
        str(path.relative_to(root)): _sha256(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def cache_key(files: Mapping[str, str], **parts: Any) -> str:
    """The key: model file hashes plus everything else that makes an entry valid (plan options,
    hardware fingerprint, runtime versions), canonically serialised."""
    document = json.dumps({"files": dict(files), **parts}, sort_keys=True, default=str)
    return hashlib.sha256(document.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    decision: dict[str, Any]
    size: int
    last_used: float

    @property
    def artefacts(self) -> Path:
        return self.path / _ARTEFACTS


def _directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class ModelCache:
    def __init__(self, root: Path, max_bytes: int = 2 << 30) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- reading -----------------------------------------------------------------------------

    def _read(self, path: Path, verify: bool) -> CacheEntry | None:
        try:
            manifest = json.loads((path / _MANIFEST).read_text())
            if verify:
                recorded = manifest["files"]
                present = hash_files(path)
                present.pop(_MANIFEST, None)
                present.pop(_LAST_USED, None)
                if present != recorded:
                    return None
            decision = json.loads((path / _DECISION).read_text())
            last_used = (path / _LAST_USED).stat().st_mtime if (path / _LAST_USED).exists() else 0.0
        except (OSError, ValueError, KeyError):
            return None
        return CacheEntry(path.name, path, decision, int(manifest.get("size", 0)), last_used)

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` after checking every file against its manifest; a corrupt or partial
        entry is removed and reported as a miss."""
        path = self.root / key
        if not path.is_dir():
            return None
        entry = self._read(path, verify=True)
        if entry is None:
            with self._locked():
                shutil.rmtree(path, ignore_errors=True)
            return None
        (path / _LAST_USED).touch()
        return entry

    def entries(self) -> list[CacheEntry]:
        found = []
        for path in sorted(self.root.iterdir()):
            if path.is_dir() and not path.name.startswith("."):
                entry = self._read(path, verify=False)
                if entry is not None:
                    found.append(entry)
        return found

    # -- writing -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A scratch directory for artefacts being built; pass it to ``store``."""
        staging = self.root / ".staging"
        staging.mkdir(exist_ok=True)
        path = Path(tempfile.mkdtemp(dir=staging))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def store(self, key: str, decision: Mapping[str, Any], artefacts: Path | None = None) -> CacheEntry:
        """Write an entry atomically; if another writer stored the same key first, theirs is kept."""
        staging = self.root / ".staging"
        staging.mkdir(exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=staging))
        try:
            if artefacts is not None and artefacts.is_dir():
                shutil.copytree(artefacts, build / _ARTEFACTS)
            else:
                (build / _ARTEFACTS).mkdir()
            (build / _DECISION).write_text(json.dumps(decision, indent=2, sort_keys=True, default=str))
            files = hash_files(build)
            size = _directory_size(build)
            manifest = {"key": key, "created": time.time(), "files": files, "size": size}
            (build / _MANIFEST).write_text(json.dumps(manifest, indent=2))
            for path in build.rglob("*"):
                if path.is_file():
                    with open(path, "rb+") as handle:
                        os.fsync(handle.fileno())
            with self._locked():
                target = self.root / key
                if target.exists():
                    shutil.rmtree(target)  # a stale or corrupt entry for the same key
                build.rename(target)
                (target / _LAST_USED).touch()
                self._evict(keep=key)
        finally:
            shutil.rmtree(build, ignore_errors=True)
        # Not read back: another writer may already be replacing the entry with its own copy.
        return CacheEntry(key, self.root / key, json.loads(json.dumps(decision, default=str)), size, time.time())

    def _evict(self, keep: str) -> list[str]:
        """Remove least recently used entries until the cache fits (caller holds the lock)."""
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.size for e in entries)
        removed = []
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry.key == keep:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            total -= entry.size
            removed.append(entry.key)
        return removed

    def remove(self, keys: Iterable[str]) -> int:
        with self._locked():
            count = 0
            for key in keys:
                if (self.root / key).is_dir():
                    shutil.rmtree(self.root / key)
                    count += 1
            return count

    def clear(self) -> int:
        return self.remove([e.key for e in self.entries()])
