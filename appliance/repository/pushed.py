"""Models pushed over the load API's file overrides, kept as an overlay of the repository.

Triton's load API takes a model's files in the request (``"file:1/model.onnx": <base64>``, with the
``config`` that must come with them). Triton writes them to a temporary directory for the life of the
model; here they are written under ``<state_dir>/pushed/`` instead, never into (or outside) the
model repository, so that they survive a restart: a pushed model is served in place of the
repository's model of the same name until it is unloaded (or a plain load brings the repository's
back).

Layout: ``pushed/<generation>/<model>/`` is a Triton model directory (``config.pbtxt`` written from the
pushed JSON, the pushed files), ``pushed/<generation>/origin.json`` says what it is and is written last:
a generation without it is a push that never finished (a crash, a failed load) and is removed at start.
The newest complete generation of a model is its overlay; older ones are removed once a newer one
serves.

Names are confined: relative, plain components (no ``..``, no ``.``, no hidden or empty ones), the top
directory either a version number or ``warmup``; files are created with O_EXCL|O_NOFOLLOW in
directories this module just made, so nothing can be redirected through a symbolic link. Each file and
all pushed models together are bounded in bytes.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import errno
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import InsufficientStorage, InvalidInput, PayloadTooLarge
from appliance.repository.config import CONFIG_FILENAME

__all__ = ["FILE_PREFIX", "PushLimits", "PushStore", "Staged", "check_push_name", "file_parameters"]

log = logging.getLogger(__name__)

FILE_PREFIX = "file:"
ORIGIN_FILE = "origin.json"
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_VERSION_DIR = re.compile(r"[1-9][0-9]{0,17}")
_MAX_DEPTH = 8
_MAX_FILES = 1000


@dataclasses.dataclass(frozen=True)
class PushLimits:
    max_file_bytes: int
    """Largest single pushed file."""
    max_total_bytes: int
    """All pushed models kept together (a push replacing a model's files does not count the old ones)."""


@dataclasses.dataclass(frozen=True)
class Staged:
    """A push written to disk, not yet serving."""

    name: str
    generation: Path
    files: dict[str, int]
    """Relative path -> size in bytes."""

    @property
    def model_dir(self) -> Path:
        return self.generation / self.name


def check_push_name(name: str) -> None:
    """Refuse a model name the store cannot keep: a generation holds its model's directory beside
    origin.json (and, while it is written, .origin.json.tmp), and a hidden name is never served (scans
    skip hidden entries)."""
    if name == ORIGIN_FILE or name.startswith("."):
        raise InvalidInput(f"a pushed model cannot be named {name[:80]!r}: the names {ORIGIN_FILE!r} and any "
                           "starting with '.' are the pushed-model store's own; name the model otherwise")


def _check_name(relative: str) -> str:
    """The normalised relative path of a pushed file; InvalidInput unless it is a plain, confined one."""
    shown = relative[:120]
    if not relative or "\0" in relative or "\\" in relative:
        raise InvalidInput(f"file override {FILE_PREFIX}{shown!r}: name a file such as 'file:1/model.onnx'")
    # Triton joins the name to the model's directory, so 'file:/1/model.py' is that directory's 1/model.py
    # (qa L0_backend_python model_control sends it so); what follows the slashes is checked as any name.
    relative = relative.lstrip("/")
    if not relative:
        raise InvalidInput(f"file override {FILE_PREFIX}{shown!r}: name a file such as 'file:1/model.onnx'")
    parts = relative.split("/")
    if len(parts) > _MAX_DEPTH or not all(_COMPONENT.fullmatch(part) for part in parts):
        raise InvalidInput(f"file override {FILE_PREFIX}{shown!r}: every part of the path must be a plain name "
                           "(letters, digits, '_', '-', '.'; no '..', no hidden or empty parts), at most "
                           f"{_MAX_DEPTH} deep")
    if len(parts) == 1:
        if parts[0] == CONFIG_FILENAME:
            raise InvalidInput(f"file override 'file:{CONFIG_FILENAME}': send the configuration as the 'config' "
                               "parameter (JSON), as Triton's load API takes it")
    elif not (_VERSION_DIR.fullmatch(parts[0]) or parts[0] == "warmup"):
        raise InvalidInput(f"file override {FILE_PREFIX}{shown!r}: a directory at the top of a model must be a "
                           "version number without leading zeros (such as 1) or 'warmup'")
    return relative


def file_parameters(parameters: Mapping[str, Any], max_file_bytes: int) -> dict[str, bytes]:
    """The ``file:<path>`` parameters of a load request, checked and decoded: base64 text (HTTP) or
    bytes (gRPC's bytes_param)."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith(FILE_PREFIX):
            continue
        relative = _check_name(key[len(FILE_PREFIX):])
        if isinstance(value, str):
            if len(value) > (max_file_bytes + 2) // 3 * 4 + 4:  # refused before decoding
                raise PayloadTooLarge(f"file override {key[:120]!r} is larger than push_max_file_bytes "
                                      f"({max_file_bytes}); raise the setting on the box or push a smaller file")
            try:
                data = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInput(f"file override {key[:120]!r} is not base64 text; over HTTP the files of a "
                                   "load request are base64-encoded") from None
        elif isinstance(value, bytes):
            data = value
        else:
            raise InvalidInput(f"file override {key[:120]!r} must be base64 text (HTTP) or bytes (gRPC)")
        if len(data) > max_file_bytes:
            raise PayloadTooLarge(f"file override {key[:120]!r} has {len(data)} bytes, more than push_max_file_bytes "
                                  f"({max_file_bytes}); raise the setting on the box or push a smaller file")
        files[relative] = data
    if len(files) > _MAX_FILES:
        raise InvalidInput(f"a load request may carry at most {_MAX_FILES} files, got {len(files)}")
    for relative in files:  # "1/model.onnx" and "1/model.onnx/x" cannot both be files
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in files:
                raise InvalidInput(f"file override 'file:{'/'.join(parts[:depth])}' is both a file and a directory")
    return files


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class PushStore:
    """The pushed models under ``root`` (blocking methods: call them off the event loop). Thread-safe."""

    def __init__(self, root: Path, limits: PushLimits) -> None:
        self.root = root
        self.limits = limits
        self._lock = threading.Lock()
        self._current: dict[str, Path] = {}
        """Model name -> its serving generation directory."""
        self._sizes: dict[Path, int] = {}
        self._pending: set[Path] = set()

    def open(self) -> dict[str, Path]:
        """Read what earlier runs kept: the newest complete generation of each model; half-written and
        superseded generations are removed. Returns model name -> model directory."""
        with self._lock:
            self._current.clear()
            if not self.root.is_dir():
                return {}
            found: dict[str, list[Path]] = {}
            for generation in sorted(self.root.iterdir()):
                origin = self._read_origin(generation)
                if origin is None:
                    log.warning("removing %s: a push that never finished", generation)
                    shutil.rmtree(generation, ignore_errors=True)
                    continue
                found.setdefault(origin["name"], []).append(generation)
            for name, generations in found.items():
                *old, newest = sorted(generations)
                for generation in old:
                    shutil.rmtree(generation, ignore_errors=True)
                self._current[name] = newest
                self._sizes[newest] = _tree_bytes(newest)
            return {name: generation / name for name, generation in self._current.items()}

    def _read_origin(self, generation: Path) -> dict[str, Any] | None:
        try:
            if generation.is_symlink() or not generation.is_dir():
                return None
            origin = json.loads((generation / ORIGIN_FILE).read_text())
        except (OSError, ValueError):
            return None
        name = origin.get("name") if isinstance(origin, dict) else None
        if not isinstance(name, str) or not (generation / name).is_dir():
            return None
        return origin

    def model_dirs(self) -> dict[str, Path]:
        with self._lock:
            return {name: generation / name for name, generation in self._current.items()}

    def origin(self, name: str) -> dict[str, Any] | None:
        """What origin.json says of the serving push of ``name`` (None: not pushed)."""
        with self._lock:
            generation = self._current.get(name)
        return None if generation is None else self._read_origin(generation)

    def stage(self, name: str, config: mc.ModelConfig, files: Mapping[str, bytes]) -> Staged:
        """Write a push to a new generation; on any failure nothing of it is left on disk."""
        size = sum(len(data) for data in files.values())
        with self._lock:
            kept = sum(s for n, g in self._current.items() if n != name for s in [self._sizes.get(g, 0)])
            pending = sum(self._sizes.get(g, 0) for g in self._pending)
            if kept + pending + size > self.limits.max_total_bytes:
                raise PayloadTooLarge(
                    f"pushing {size} bytes for '{name}' would keep {kept + pending + size} bytes of pushed models, "
                    f"more than push_max_total_bytes ({self.limits.max_total_bytes}); unload pushed models that "
                    "are no longer needed or raise the setting on the box")
            generation = self.root / f"{time.time_ns():020d}-{secrets.token_hex(4)}"
            self._pending.add(generation)
            self._sizes[generation] = size
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.mkdir(generation, 0o700)
            model_dir = generation / name
            os.mkdir(model_dir, 0o700)
            self._write(model_dir, CONFIG_FILENAME, text_format.MessageToString(config).encode())
            for relative, data in sorted(files.items()):
                self._write(model_dir, relative, data)
        except BaseException as exc:
            self.discard(Staged(name, generation, {}))
            _raise_if_full(exc, self.root, f"'{name}' ({size} bytes)")
            raise
        return Staged(name, generation, {relative: len(data) for relative, data in files.items()})

    @staticmethod
    def _write(model_dir: Path, relative: str, data: bytes) -> None:
        parts = relative.split("/")
        directory = model_dir
        for part in parts[:-1]:
            directory = directory / part
            if not directory.is_dir() or directory.is_symlink():
                os.mkdir(directory, 0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(directory / parts[-1], flags, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def discard(self, staged: Staged) -> None:
        """Remove a push that did not load."""
        with self._lock:
            self._pending.discard(staged.generation)
            self._sizes.pop(staged.generation, None)
        shutil.rmtree(staged.generation, ignore_errors=True)

    def commit(self, staged: Staged, pushed_by: str | None = None) -> Path | None:
        """The staged push serves now: mark it complete (origin.json, written last and atomically) and
        return the generation it replaces (to remove once the old versions are gone), if any."""
        origin = {"name": staged.name, "origin": "pushed", "pushed_at": time.time(), "pushed_by": pushed_by,
                  "files": staged.files, "bytes": sum(staged.files.values())}
        temporary = staged.generation / f".{ORIGIN_FILE}.tmp"
        try:
            with open(temporary, "w") as handle:
                json.dump(origin, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, staged.generation / ORIGIN_FILE)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            _raise_if_full(exc, self.root, f"'{staged.name}'")
            raise
        with self._lock:
            self._pending.discard(staged.generation)
            replaced = self._current.get(staged.name)
            self._current[staged.name] = staged.generation
            if replaced is not None:
                self._sizes.pop(replaced, None)
        return replaced

    def remove(self, name: str) -> bool:
        """Forget the pushed files of ``name`` (after an unload, or a load from the repository)."""
        with self._lock:
            generation = self._current.pop(name, None)
            if generation is not None:
                self._sizes.pop(generation, None)
        if generation is None:
            return False
        shutil.rmtree(generation, ignore_errors=True)
        return True

    @staticmethod
    def remove_generation(generation: Path) -> None:
        shutil.rmtree(generation, ignore_errors=True)


def _raise_if_full(error: BaseException, root: Path, what: str) -> None:
    """A disk (or quota) full while a push was written is the box's state, not a bug: 507, saying so."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise InsufficientStorage(
            f"the disk holding {root} is full ({error.strerror}): the push of {what} was not kept and nothing of "
            "it is left on disk; free space there (or unload pushed models no longer needed) and push again"
        ) from None
