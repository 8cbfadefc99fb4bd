"""A directory of cache entries, one per (model files, plan options, hardware, runtime versions).

Each entry is ``<root>/<key>/`` with ``decision.json`` (the chosen plan and its measurements),
``artefacts/`` (compiled blobs a runtime reuses) and ``manifest.json`` (sha256 of every file). Entries
are written into a staging directory and renamed into place, so a reader sees a whole entry or none; a
manifest that does not match its files marks a corrupt entry, which is discarded and rebuilt, never
loaded. Any entry that cannot be read (a missing file, invalid JSON, JSON of the wrong shape) is a
miss, listed by ``broken()``, removed by ``clear()`` and by eviction. Writers serialise on a file lock,
so two daemons (or a daemon and ``appliance tune``) can share a cache. The total size is bounded: the
least recently used entries go first.

A cache opened with ``writable=False`` (a read-only state dir) serves hits and writes nothing: no
``.last_used`` touch, no removal, ``store`` raises ``CacheReadOnly`` and ``staging`` is a temporary
directory elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["BrokenEntry", "CacheEntry", "CacheReadOnly", "ModelCache", "cache_key", "hash_files"]

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


@dataclasses.dataclass(frozen=True)
class BrokenEntry:
    """An entry directory that cannot be used: never a hit, removed by ``clear`` and eviction."""

    key: str
    path: Path
    reason: str
    size: int
    removed: bool = False


class CacheReadOnly(OSError):
    """``store`` or ``remove`` on a cache opened read-only."""


class _Unreadable(Exception):
    """Why an entry directory cannot be used (the message)."""


def _directory_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):  # a file removed meanwhile counts for nothing
            if p.is_file():
                total += p.stat().st_size
    return total


def _json_object(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise _Unreadable(f"cannot read {path.name}: {exc.strerror or exc}") from None
    except ValueError as exc:  # invalid JSON or not UTF-8
        raise _Unreadable(f"{path.name} is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise _Unreadable(f"{path.name} holds a JSON {type(document).__name__}, not an object")
    return document


def _manifest_fields(manifest: dict[str, Any]) -> tuple[dict[str, str], int]:
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise _Unreadable(f"{_MANIFEST} has no 'files' object of path -> sha256")
    size = manifest.get("size", 0)
    if type(size) is not int or size < 0:
        raise _Unreadable(f"{_MANIFEST}'s 'size' is {size!r}, not a byte count")
    return files, size


class ModelCache:
    def __init__(self, root: Path, max_bytes: int = 2 << 30, writable: bool = True,
                 on_broken: Callable[[BrokenEntry], None] | None = None) -> None:
        """``on_broken`` hears of each unreadable entry a lookup or an eviction meets (to report it)."""
        self.root = root
        self.max_bytes = max_bytes
        self.writable = writable
        self._on_broken = on_broken
        if writable:
            self.root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _refuse_writes(self, what: str) -> None:
        if not self.writable:
            raise CacheReadOnly(errno.EROFS, f"the model cache is read-only; cannot {what}", str(self.root))

    # -- reading -----------------------------------------------------------------------------

    def _read(self, path: Path, verify: bool) -> CacheEntry:
        """The entry in ``path``; raises _Unreadable with the reason when it cannot be used."""
        files, size = _manifest_fields(_json_object(path / _MANIFEST))
        if verify:
            try:
                present = hash_files(path)
            except OSError as exc:
                raise _Unreadable(f"cannot read its files: {exc}") from None
            present.pop(_MANIFEST, None)
            present.pop(_LAST_USED, None)
            # Runtimes add compiled blobs to artefacts/ while serving (OpenVINO's CACHE_DIR, which checks
            # its own blobs): files the manifest does not name are allowed there, and only there.
            added = [name for name in present if name not in files and not name.startswith(f"{_ARTEFACTS}/")]
            if added or any(present.get(name) != digest for name, digest in files.items()):
                raise _Unreadable(f"its files do not match {_MANIFEST} (truncated, changed or partly written)")
        decision = _json_object(path / _DECISION)
        try:
            last_used = (path / _LAST_USED).stat().st_mtime
        except OSError:
            last_used = 0.0
        return CacheEntry(path.name, path, decision, size, last_used)

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` after checking every file against its manifest; an entry that cannot
        be used is a miss (and removed, in a writable cache)."""
        path = self.root / key
        if not path.is_dir():
            return None
        try:
            entry = self._read(path, verify=True)
        except _Unreadable as exc:
            found = self._discard(path, str(exc))
            if found is None:
                return None
            entry = found
        if self.writable:
            # The least-recently-used order is a hint: a failed touch must never fail a hit.
            with contextlib.suppress(OSError):
                (path / _LAST_USED).touch()
        return entry

    def _discard(self, path: Path, reason: str) -> CacheEntry | None:
        """Report a broken entry and, in a writable cache, remove it. Under the lock it is read again:
        a writer may have just renamed a whole entry into place, which is then the answer."""
        removed, size = False, _directory_size(path)
        if self.writable:
            try:
                with self._locked():
                    try:
                        return self._read(path, verify=True)
                    except _Unreadable as exc:
                        reason = str(exc)
                    shutil.rmtree(path, ignore_errors=True)
                    removed = not path.exists()
            except OSError:  # the lock file cannot be opened: the disk went read-only since
                pass
        self._report(BrokenEntry(path.name, path, reason, size, removed))
        return None

    def _report(self, broken: BrokenEntry) -> None:
        if self._on_broken is not None:
            self._on_broken(broken)

    def _scan(self) -> tuple[list[CacheEntry], list[BrokenEntry]]:
        sound: list[CacheEntry] = []
        broken: list[BrokenEntry] = []
        try:
            paths = sorted(self.root.iterdir())
        except OSError:  # no cache yet (a read-only state dir that never had one)
            return sound, broken
        for path in paths:
            if path.is_dir() and not path.name.startswith("."):
                try:
                    sound.append(self._read(path, verify=False))
                except _Unreadable as exc:
                    broken.append(BrokenEntry(path.name, path, str(exc), _directory_size(path)))
        return sound, broken

    def entries(self) -> list[CacheEntry]:
        """The entries that can be read (their files are verified on lookup, not here)."""
        return self._scan()[0]

    def broken(self) -> list[BrokenEntry]:
        """Entry directories that cannot be read: their manifest or decision is missing, not JSON, or
        JSON of the wrong shape."""
        return self._scan()[1]

    # -- writing -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A scratch directory for artefacts being built; pass it to ``store``. A read-only cache
        stages in the system's temporary directory."""
        if self.writable:
            staging = self.root / ".staging"
            staging.mkdir(exist_ok=True)
            path = Path(tempfile.mkdtemp(dir=staging))
        else:
            path = Path(tempfile.mkdtemp(prefix="model-cache-staging-"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def store(self, key: str, decision: Mapping[str, Any], artefacts: Path | None = None) -> CacheEntry:
        """Write an entry atomically; if another writer stored the same key first, theirs is kept.
        Raises ``CacheReadOnly`` on a read-only cache and OSError when the disk refuses the write."""
        self._refuse_writes(f"store entry {key}")
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
        """Remove broken entries, then least recently used ones until the cache fits (caller holds
        the lock, so no writer is half-way through an entry)."""
        entries, broken = self._scan()
        removed = []
        for bad in broken:
            if bad.key != keep:
                shutil.rmtree(bad.path, ignore_errors=True)
                removed.append(bad.key)
                self._report(dataclasses.replace(bad, removed=True))
        entries.sort(key=lambda e: e.last_used)
        total = sum(e.size for e in entries)
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
        self._refuse_writes("remove entries")
        with self._locked():
            count = 0
            for key in keys:
                if (self.root / key).is_dir():
                    shutil.rmtree(self.root / key)
                    count += 1
            return count

    def clear(self) -> int:
        """Remove every entry, readable or broken; the number removed."""
        entries, broken = self._scan()
        return self.remove([e.key for e in entries] + [b.key for b in broken])
