"""Packed Python environments (conda-pack or venv-pack archives) unpacked once, keyed by their digest.

Triton's python backend runs a model in the environment its config names (``EXECUTION_ENV_PATH``). An
archive is unpacked into ``<root>/<sha256 of the archive>/``, whole or not at all (into a scratch
directory renamed into place), so a second load, and every other model naming the same archive, uses
it as it is.

The archive is a stranger's: nothing in it may land outside its directory, or change anything there.
Each tar member passes ``tarfile``'s ``data_filter`` (no absolute names, no links out, no devices or
FIFOs, no set-id or group/other-writable modes, no owners) and, because that filter resolves paths with
``os.path.realpath``, which gives up quietly on a long enough chain, a resolution of our own against the
directory as unpacked so far: a member's parents must be real directories of the environment (never a
link), a symbolic link must resolve inside the environment however it chains (``a -> .``,
``b -> a/..`` is refused at ``b``), and a hard link must name a regular file the archive already wrote.
Names with ``..`` or a leading ``/`` are refused outright. One exception to ``data_filter``: a venv's
``bin/python``, ``bin/python3`` or ``bin/python3.X`` may be a link to the absolute path of the
interpreter it was made with (venv-pack keeps it as it is; the environment runs on it), which must be an
existing executable file here. A regular file may appear twice (venv-pack 0.2.0 writes ``pyvenv.cfg``
twice): the last one wins, as with tar; anything else written twice, or through a link, is refused.

Unpacking is bounded (``UnpackLimits``, the settings ``environment_max_unpacked_bytes`` and
``environment_max_members``): the members' declared sizes are summed before each is written, and what was
written is counted too; the member count is checked as the archive is read; no single read of the
archive's stream (a pax or GNU long-name header) exceeds 1 MiB. A refused, broken or oversized archive
raises ``BrokenEnvironment`` naming the archive, the member or the limit, and leaves nothing behind.
Unpacking blocks (seconds to minutes): the loader runs it on its thread, never on the event loop.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import io
import logging
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

__all__ = ["BrokenEnvironment", "UnpackLimits", "interpreter", "unpack_environment"]

log = logging.getLogger(__name__)

_COMPLETE = ".unpacked"
_INTERPRETER_LINK = re.compile(r"bin/python(3(\.\d+)?)?")
_MAX_READ = 1 << 20
"""The most bytes one read of the archive's stream may ask for (a header's; data goes in 16 KiB reads)."""
_NO_OWNER: dict[str, Any] = {"uid": None, "gid": None, "uname": None, "gname": None}
"""What data_filter sets of a member's owner: nothing (the daemon's user owns the environment)."""
_MAX_HOPS = 64
"""Symbolic links followed while resolving one path (Linux stops at 40)."""


class BrokenEnvironment(ValueError):
    """An environment archive that cannot be used (unreadable, not an archive, unsafe or too large)."""


@dataclasses.dataclass(frozen=True, slots=True)
class UnpackLimits:
    """How much one environment archive may unpack to (the settings of the same names)."""

    max_unpacked_bytes: int = 8 << 30
    max_members: int = 200_000


def _digest(archive: Path) -> str:
    digest = hashlib.sha256()
    with archive.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def unpack_environment(archive: Path, root: Path, limits: UnpackLimits = UnpackLimits()) -> Path:
    """The directory ``archive`` (a .tar.gz/.tgz/.tar.bz2/.tar.xz/.tar, or .zip without links) is unpacked
    in under ``root``, unpacked now unless it already was. Blocking."""
    try:
        target = root / _digest(archive)[:32]
    except OSError as exc:
        raise BrokenEnvironment(f"cannot read the environment archive {archive}: {exc}") from None
    if (target / _COMPLETE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
    started = time.monotonic()
    log.info("unpacking the environment archive %s (%.1f MiB) into %s", archive, archive.stat().st_size / 2**20,
             target)
    try:
        unpacked = _Unpacked(archive, Path(os.path.realpath(scratch)), limits)
        if zipfile.is_zipfile(archive):
            unpacked.extract_zip()
        else:
            unpacked.extract_tar()
        (scratch / _COMPLETE).unlink(missing_ok=True)  # the archive's own, if any: never written through
        (scratch / _COMPLETE).write_text(str(archive))
        try:
            os.replace(scratch, target)
        except OSError:
            if not (target / _COMPLETE).is_file():  # not another process that unpacked it meanwhile
                shutil.rmtree(target, ignore_errors=True)
                os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("unpacked the environment archive %s: %d members, %.1f MiB in %.1f s", archive, unpacked.members,
             unpacked.written / 2**20, time.monotonic() - started)
    return target


class _BoundedReads:
    """The archive's (decompressed) stream, refusing any one read larger than _MAX_READ: tarfile reads a
    pax or GNU long-name header whole, at the size the header before it declares."""

    def __init__(self, stream: io.BufferedIOBase | IO[bytes], archive: Path) -> None:
        self._stream = stream
        self._archive = archive

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > _MAX_READ:
            raise BrokenEnvironment(f"the environment archive {self._archive} holds a header of {size} bytes, more "
                                    f"than the {_MAX_READ} allowed; pack it again with conda-pack or venv-pack")
        return self._stream.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


def _decompressed(raw: IO[bytes]) -> io.BufferedIOBase | IO[bytes]:
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if magic == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)
    return raw


class _Unpacked:
    """One archive being unpacked into ``into`` (resolved, empty), with what it has written so far."""

    def __init__(self, archive: Path, into: Path, limits: UnpackLimits) -> None:
        self.archive = archive
        self.into = into
        self.limits = limits
        self.members = 0
        self.declared = 0
        self.written = 0
        self._kinds: dict[str, str] = {}
        """Each name written so far: 'file', 'dir' or 'link' (symbolic or hard)."""
        self._interpreters: set[str] = set()
        """The bin/python* links to the interpreter the venv was made with (absolute, outside)."""

    def _refuse(self, name: str, why: str) -> BrokenEnvironment:
        return BrokenEnvironment(f"the environment archive {self.archive} holds {name[:200]!r}, {why}")

    def _count(self, name: str, size: int) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise BrokenEnvironment(
                f"the environment archive {self.archive} has more than {self.limits.max_members} members "
                "(environment_max_members); raise the setting if the environment is that large")
        self.declared += max(size, 0)
        if self.declared > self.limits.max_unpacked_bytes:
            raise BrokenEnvironment(
                f"the environment archive {self.archive} unpacks to more than {self.limits.max_unpacked_bytes} "
                f"bytes (environment_max_unpacked_bytes) at {name[:200]!r}; raise the setting if the environment "
                "is that large")

    def _name(self, name: str) -> str:
        """``name`` as a plain relative path, refused when absolute or climbing out."""
        path = PurePosixPath(name)
        if not name or "\0" in name or path.is_absolute() or ".." in path.parts or str(path) == ".":
            raise self._refuse(name, "a path outside the environment; it is refused")
        return str(path)

    def _written(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                self.written += info.st_size
        if self.written > self.limits.max_unpacked_bytes:  # headers are not trusted: what was written counts
            raise BrokenEnvironment(
                f"the environment archive {self.archive} wrote more than {self.limits.max_unpacked_bytes} bytes "
                "(environment_max_unpacked_bytes); raise the setting if the environment is that large")

    # -- zip ----------------------------------------------------------------------------------------

    def extract_zip(self) -> None:
        try:
            with zipfile.ZipFile(self.archive) as packed:
                for info in packed.infolist():  # zip members are files and directories only
                    self._count(info.filename, info.file_size)
                    self._name(info.filename)
                    self._written(Path(packed.extract(info, self.into)))
        except (OSError, EOFError, zipfile.BadZipFile) as exc:
            raise BrokenEnvironment(f"the environment archive {self.archive} cannot be unpacked ({exc}); pack it "
                                    "again with conda-pack or venv-pack (a .tar.gz)") from None

    # -- tar ----------------------------------------------------------------------------------------

    def extract_tar(self) -> None:
        try:
            with contextlib.ExitStack() as stack:
                raw = stack.enter_context(self.archive.open("rb"))
                stream = stack.enter_context(_decompressed(raw))
                packed = stack.enter_context(tarfile.TarFile(fileobj=_BoundedReads(stream, self.archive)))  # type: ignore[arg-type]
                for member in packed:
                    self._admit(member)
                    packed.extract(member, self.into, set_attrs=not member.isdir(), filter=self._filter)
                    if member.isreg():
                        self._written(self.into / self._name(member.name))
        except (tarfile.TarError, EOFError, OSError, zipfile.BadZipFile, lzma.LZMAError) as exc:
            raise BrokenEnvironment(f"the environment archive {self.archive} cannot be unpacked ({exc}); pack it "
                                    "again with conda-pack or venv-pack (a .tar.gz)") from None

    def _admit(self, member: tarfile.TarInfo) -> None:
        """Bounds, names and what was written before, checked before ``member`` is extracted."""
        self._count(member.name, member.size)
        name = self._name(member.name)
        if member.isdev() or member.isfifo():
            raise self._refuse(member.name, "a device or FIFO; it is refused")
        if member.islnk():
            self._name(member.linkname)
        kind = "dir" if member.isdir() else "link" if member.issym() or member.islnk() else "file"
        parents = [str(parent) for parent in PurePosixPath(name).parents][:-1]
        earlier = self._kinds.get(name)
        # A member written through a link (or over one) could land where the link points.
        if earlier is not None and (earlier != kind or kind == "link") or any(
                self._kinds.get(parent) not in (None, "dir") for parent in parents):
            raise self._refuse(member.name, "written twice or through a link; it is refused")
        self._kinds[name] = kind

    def _filter(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        """tarfile's data_filter, then our own resolution against what is on disk now. The interpreter
        link (and a link that resolves to it, as bin/python3 -> python3.11 -> /usr/bin/python3.11) passes
        tar_filter instead, owners dropped as data_filter drops them."""
        name = self._name(member.name)
        try:
            if member.issym() and PurePosixPath(member.linkname).is_absolute():
                checked = self._interpreter_link(member, name, dest)
            else:
                try:
                    checked = tarfile.data_filter(member, dest)
                except tarfile.LinkOutsideDestinationError:
                    if not member.issym() or self._resolve(os.path.join(os.path.dirname(name), member.linkname),
                                                           stop_at_interpreter=True) is None:
                        raise
                    checked = tarfile.tar_filter(member, dest).replace(**_NO_OWNER, deep=False)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
            raise self._refuse(member.name, f"a link out of the environment to {member.linkname[:200]!r}; it is "
                                            "refused (only bin/python may name the interpreter it was made "
                                            "with)") from None
        except tarfile.SpecialFileError:
            raise self._refuse(member.name, "a device or FIFO; it is refused") from None
        except tarfile.FilterError as exc:
            raise self._refuse(member.name, f"a path outside the environment ({exc}); it is refused") from None
        self._confine(member, name)
        return checked

    def _interpreter_link(self, member: tarfile.TarInfo, name: str, dest: str) -> tarfile.TarInfo:
        if _INTERPRETER_LINK.fullmatch(name) is None:
            raise tarfile.AbsoluteLinkError(member)
        if not Path(member.linkname).is_file() or not os.access(member.linkname, os.X_OK):
            raise self._refuse(member.name, f"a link out of the environment to {member.linkname[:200]!r}; only "
                                            "bin/python may name the interpreter it was made with (which must "
                                            "exist here)")
        self._interpreters.add(name)
        return tarfile.tar_filter(member, dest).replace(**_NO_OWNER, deep=False)

    def _confine(self, member: tarfile.TarInfo, name: str) -> None:
        parent = str(PurePosixPath(name).parent)
        if parent != "." and self._resolve(parent) != str(self.into / parent):
            raise self._refuse(member.name, "written twice or through a link; it is refused")
        here = self.into / name
        if os.path.lexists(here):
            existing = os.lstat(here).st_mode
            if not (member.isreg() and stat.S_ISREG(existing) or member.isdir() and stat.S_ISDIR(existing)):
                raise self._refuse(member.name, "written twice or through a link; it is refused")
        if member.issym() and name not in self._interpreters:
            if self._resolve(os.path.join(parent, member.linkname), stop_at_interpreter=True) is None:
                raise self._refuse(member.name, f"a link out of the environment to {member.linkname[:200]!r}; "
                                                "it is refused")
        elif member.islnk():
            target = self._name(member.linkname)
            resolved = self._resolve(target)
            if resolved != str(self.into / target) or not stat.S_ISREG(os.lstat(resolved).st_mode):
                raise self._refuse(member.name, f"a hard link to {member.linkname[:200]!r}, which is not a file the "
                                                "archive wrote before; it is refused")

    def _resolve(self, relative: str, stop_at_interpreter: bool = False) -> str | None:
        """``into/relative`` with every link on disk followed, or None where that leaves ``into`` (or
        follows more than _MAX_HOPS links). Components that do not exist yet are taken as written. With
        ``stop_at_interpreter``, a path ending on the interpreter link is that link (inside)."""
        pending = [part for part in relative.split("/") if part not in ("", ".")]
        pending.reverse()
        current: list[str] = []
        hops = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if not current:
                    return None
                current.pop()
                continue
            candidate = os.path.join(self.into, *current, part)
            try:
                info = os.lstat(candidate)
            except (FileNotFoundError, NotADirectoryError):
                current.append(part)
                continue
            if not stat.S_ISLNK(info.st_mode):
                current.append(part)
                continue
            if stop_at_interpreter and not pending and "/".join([*current, part]) in self._interpreters:
                return candidate
            hops += 1
            target = os.readlink(candidate)
            if hops > _MAX_HOPS or target.startswith("/"):
                return None
            pending.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
        return os.path.join(self.into, *current)


def interpreter(environment: Path) -> Path:
    """The Python an environment directory runs with (``bin/python3``, ``bin/python``)."""
    for name in ("bin/python3", "bin/python"):
        candidate = environment / name
        if candidate.exists() and os.access(candidate, os.X_OK):
            return candidate
    raise BrokenEnvironment(f"the environment {environment} has no bin/python3 or bin/python; an "
                            "EXECUTION_ENV_PATH environment is a conda or venv environment, packed or not")
