"""The model repository on disk: which of its directories are models (plainly named, inside it), the
directory of one model (never outside the repository), and what a model's files look like (a change
means reload)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import blake3

from appliance.core.errors import InvalidInput

__all__ = ["content_digest", "directory_signature", "model_directory", "scan_models"]

log = logging.getLogger(__name__)

# Model names as they may appear in URLs: no separators, no NUL, bounded length.
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,255}")


def directory_signature(path: Path) -> tuple:
    """Names, sizes and modification times of every file of a model: a change means reload."""
    return tuple(sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts))


def content_digest(model_dir: Path, version_dir: Path, config: bytes) -> bytes:
    """What a version's answers depend on, as a digest: its name, ``config`` (the serialized config it
    runs with), the files of its version directory and those beside its versions (labels, the config
    file). Two servers holding the same model compute the same digest (a shared response cache's
    namespace); a changed file changes it."""
    digest = blake3.blake3(f"{model_dir.name}\0{version_dir.name}\0".encode())
    digest.update(len(config).to_bytes(8, "little") + config)
    files = [p for p in model_dir.iterdir() if p.is_file()] + [
        p for p in version_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        name = str(path.relative_to(model_dir)).encode()
        digest.update(len(name).to_bytes(8, "little") + name + path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.digest()


def scan_models(repository: Path, pushed: Mapping[str, Path]) -> list[Path]:
    """Model directories in ``repository`` (hidden entries and plain files are skipped), with the ``pushed``
    ones (model name -> directory) served in place of the repository's, sorted by name."""
    if not repository.is_dir():
        raise FileNotFoundError(
            f"model repository {repository} does not exist or is not a directory; "
            "pass --model-repository DIR pointing at a Triton-layout repository"
        )
    root = repository.resolve()
    found = []
    for path in sorted(repository.iterdir()):
        if not path.is_dir() or path.name.startswith("."):
            continue
        if not path.resolve().is_relative_to(root) or not _NAME.fullmatch(path.name):
            log.warning("skipping %s: model directories must be plainly named and inside the repository", path)
            continue
        found.append(path)
    return sorted([p for p in found if p.name not in pushed] + list(pushed.values()), key=lambda p: p.name)


def model_directory(repository: Path, name: str, pushed: Mapping[str, Path]) -> Path:
    """The directory of model ``name``: its pushed one, else the repository's, which must lie inside the
    repository (no traversal, no symlink pointing out)."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        # Triton's Python backend refuses such a name in these words (its stub launcher's check).
        raise InvalidInput(
            f"invalid model name {name[:80]!r}: use 1-255 letters, digits, '.', '_' or '-' (Invalid stub "
            "name: contains invalid characters)"
        )
    path = repository / name
    root = repository.resolve()
    if not path.resolve().is_relative_to(root) or path.resolve() == root:
        raise InvalidInput(f"model {name!r} points outside the model repository")
    return pushed.get(name, path)
