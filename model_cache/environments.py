"""Packed Python environments (conda-pack or venv-pack archives) unpacked once, keyed by their digest.

Triton's python backend runs a model in the environment its config names (``EXECUTION_ENV_PATH``). An
archive is unpacked into ``<root>/<sha256 of the archive>/``, whole or not at all (into a scratch
directory renamed into place), so a second load, and every other model naming the same archive, uses
it as it is.

The archive is a stranger's: nothing in it may land outside its directory. Members with absolute names
or ``..`` are refused, as are device files and FIFOs, a member written twice or through a link, hard
links to anything outside the archive, and
symbolic links that leave the environment, but one kind: a venv's ``bin/python*`` link to the
interpreter it was made with (venv-pack keeps it as it is; the environment runs on that interpreter),
which may point at an absolute path that is an existing executable file. A refused or broken archive
raises ``BrokenEnvironment`` naming the archive and the member, and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

__all__ = ["BrokenEnvironment", "interpreter", "unpack_environment"]

_COMPLETE = ".unpacked"
_INTERPRETER_LINK = ("bin/python", "bin/python3")


class BrokenEnvironment(ValueError):
    """An environment archive that cannot be used (unreadable, not an archive, or unsafe)."""


def _digest(archive: Path) -> str:
    digest = hashlib.sha256()
    with archive.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def unpack_environment(archive: Path, root: Path) -> Path:
    """The directory ``archive`` (a .tar.gz/.tgz/.tar.bz2/.tar.xz/.tar, or .zip without links) is unpacked
    in under ``root``, unpacked now unless it already was."""
    try:
        target = root / _digest(archive)[:32]
    except OSError as exc:
        raise BrokenEnvironment(f"cannot read the environment archive {archive}: {exc}") from None
    if (target / _COMPLETE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
    try:
        _extract(archive, scratch)
        (scratch / _COMPLETE).write_text(str(archive))
        try:
            os.replace(scratch, target)
        except OSError:
            if not (target / _COMPLETE).is_file():  # not another process that unpacked it meanwhile
                shutil.rmtree(target, ignore_errors=True)
                os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _extract(archive: Path, into: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as packed:
            for name in packed.namelist():
                _member_path(archive, name, into)
            packed.extractall(into)  # zip members are files and directories only
        return
    try:
        with tarfile.open(archive) as packed:
            members = packed.getmembers()
            links: set[str] = set()
            seen: set[str] = set()
            for member in members:
                _check(archive, member, into)
                name = str(PurePosixPath(member.name))
                parents = {str(parent) for parent in PurePosixPath(name).parents}
                # A member written through a link (or over one) could land where the link points.
                if name in seen and not member.isdir() or name in links or parents & links:
                    raise BrokenEnvironment(f"the environment archive {archive} writes {member.name[:200]!r} "
                                            "twice or through a link; it is refused")
                seen.add(name)
                if member.issym() or member.islnk():
                    links.add(name)
            packed.extractall(into, members=members, filter="tar")  # checked above; 'tar' keeps modes
    except (tarfile.TarError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise BrokenEnvironment(f"the environment archive {archive} cannot be unpacked ({exc}); pack it again "
                                "with conda-pack or venv-pack (a .tar.gz)") from None


def _member_path(archive: Path, name: str, into: Path) -> Path:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not name:
        raise BrokenEnvironment(f"the environment archive {archive} holds {name[:200]!r}, a path outside the "
                                "environment; it is refused")
    return into.joinpath(*path.parts)


def _check(archive: Path, member: tarfile.TarInfo, into: Path) -> None:
    where = _member_path(archive, member.name, into)
    if member.isdev() or member.isfifo():
        raise BrokenEnvironment(f"the environment archive {archive} holds {member.name[:200]!r}, a device or "
                                "FIFO; it is refused")
    if member.islnk():
        _member_path(archive, member.linkname, into)  # a hard link names another member
    elif member.issym():
        target = PurePosixPath(member.linkname)
        name = str(PurePosixPath(member.name)).removeprefix("./")
        if target.is_absolute():
            if not name.startswith(_INTERPRETER_LINK) or not os.access(member.linkname, os.X_OK) \
                    or not Path(member.linkname).is_file():
                raise BrokenEnvironment(f"the environment archive {archive} holds {member.name[:200]!r}, a link "
                                        f"out of the environment to {member.linkname[:200]!r}; only bin/python "
                                        "may name the interpreter it was made with (which must exist here)")
        else:
            resolved = os.path.normpath(os.path.join(os.path.dirname(where), member.linkname))
            if not Path(resolved).is_relative_to(into):
                raise BrokenEnvironment(f"the environment archive {archive} holds {member.name[:200]!r}, a link "
                                        f"out of the environment to {member.linkname[:200]!r}; it is refused")


def interpreter(environment: Path) -> Path:
    """The Python an environment directory runs with (``bin/python3``, ``bin/python``)."""
    for name in ("bin/python3", "bin/python"):
        candidate = environment / name
        if candidate.exists() and os.access(candidate, os.X_OK):
            return candidate
    raise BrokenEnvironment(f"the environment {environment} has no bin/python3 or bin/python; an "
                            "EXECUTION_ENV_PATH environment is a conda or venv environment, packed or not")
