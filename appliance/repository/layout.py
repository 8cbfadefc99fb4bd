"""The model repository on disk: which of its directories are models (plainly named, inside it), the
directory of one model (never outside the repository), and what a model's files look like (a change
means reload).

A version's *files* (``file_digests``) are everything under its model's directory that the model can
import or read: the whole tree, hidden files included, but for ``__pycache__`` directories (derived from
the sources beside them) and the directories of the model's other versions (a new version must not
re-measure the plans of the others). Each is hashed by content, so an edit that keeps a file's size and
modification time still changes the digest. A link is followed only inside the model's directory: one
that resolves outside it (or loops) fails the load, as a config naming such a file does. The walk reads
at most ``MAX_MODEL_ENTRIES`` entries, so a directory of a million files fails the load with the limit
named rather than stalling it. The digest keys the plan cache (appliance.selection) and a shared
response cache's namespace (``content_digest``)."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

import blake3

from appliance.core.errors import ConfigError, InvalidInput

__all__ = ["MAX_MODEL_ENTRIES", "content_digest", "directory_signature", "file_digests", "model_directory",
           "scan_models"]

log = logging.getLogger(__name__)

# Model names as they may appear in URLs: no separators, no NUL, bounded length.
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,255}")

MAX_MODEL_ENTRIES = 100_000
"""The most files and directories the digest of one model version walks (see the module's note)."""

_DERIVED = "__pycache__"


def directory_signature(path: Path) -> tuple:
    """Names, sizes and modification times of every file of a model: a change means reload."""
    return tuple(sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts))


def content_digest(model_dir: Path, version_dir: Path, config: bytes) -> bytes:
    """What a version's answers depend on, as a digest: its name, ``config`` (the serialized config it
    runs with) and its files (``file_digests``). Two servers holding the same model compute the same
    digest (a shared response cache's namespace); a changed file changes it. Blocking: reads every file."""
    digest = blake3.blake3(f"{model_dir.name}\0{version_dir.name}\0".encode())
    digest.update(len(config).to_bytes(8, "little") + config)
    for name, value in sorted(file_digests(model_dir, version_dir).items()):
        entry = f"{name}\0{value}\0".encode()
        digest.update(len(entry).to_bytes(8, "little") + entry)
    return digest.digest()


def file_digests(model_dir: Path, version_dir: Path) -> dict[str, str]:
    """Each file of ``version_dir``'s model, by its path in ``model_dir`` ('/'-separated): the blake3 of
    its content, ``link:<path in model_dir>`` for a link to a directory (whose files are listed once,
    under the name the walk first reaches them by) and ``special:<kind>`` for what cannot be read as a
    file (a FIFO, a device). Raises ConfigError for a link resolving outside ``model_dir``, one that
    cannot be resolved, or more than MAX_MODEL_ENTRIES entries. Blocking."""
    root = model_dir.resolve()
    others = {name for name in _version_names(model_dir) if name != version_dir.name}
    found: dict[str, str] = {}
    walked = {root}
    pending = [(model_dir, "")]
    entries = 0
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as listing:
            children = sorted(listing, key=lambda child: child.name)
        for child in children:
            if child.name == _DERIVED or (not prefix and child.name in others):
                continue
            entries += 1
            if entries > MAX_MODEL_ENTRIES:
                raise ConfigError(
                    f"model '{model_dir.name}' has more than {MAX_MODEL_ENTRIES} files and directories; the "
                    "digest that keys its cached plans and answers reads each one at load: keep only what the "
                    "model reads in its directory (data sets belong elsewhere)")
            name = prefix + child.name
            path = Path(child.path)
            real = _confined(model_dir, root, path, name) if child.is_symlink() else path
            info = real.stat()
            if stat.S_ISDIR(info.st_mode):
                if child.is_symlink():
                    found[name] = f"link:{real.relative_to(root)}"
                resolved = real.resolve()
                if resolved not in walked:
                    walked.add(resolved)
                    pending.append((path, name + "/"))
            elif stat.S_ISREG(info.st_mode):
                found[name] = _file_hash(real)
            else:
                found[name] = f"special:{stat.S_IFMT(info.st_mode):o}"
    return found


def _version_names(model_dir: Path) -> set[str]:
    """The names of ``model_dir``'s version directories (as the loader counts them)."""
    return {child.name for child in model_dir.iterdir()
            if child.is_dir() and child.name.isdigit() and not child.name.startswith("0")}


def _confined(model_dir: Path, root: Path, link: Path, name: str) -> Path:
    """Where ``link`` leads, which must lie inside ``root`` (the resolved model directory)."""
    try:
        real = Path(os.path.realpath(link, strict=True))
    except OSError as exc:
        raise ConfigError(
            f"model '{model_dir.name}': {name} is a link that cannot be followed ({exc.strerror}); remove it or "
            "point it at a file inside the model's directory") from None
    if not real.is_relative_to(root):
        raise ConfigError(
            f"model '{model_dir.name}': {name} is a link to {real}, outside the model's directory; copy what it "
            f"names into {model_dir.name}/ (links must point inside the model's directory)")
    return real


def _file_hash(path: Path) -> str:
    """blake3 of a regular file's content (a file swapped for a FIFO meanwhile is not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "special:changed"
        digest = blake3.blake3()
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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
