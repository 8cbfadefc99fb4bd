"""Packed environments unpacked once, by digest, and nothing of a hostile archive outside its directory."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from model_cache.environments import BrokenEnvironment, interpreter, unpack_environment


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as packed:
        for member in members:
            if isinstance(member, tuple):
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                info.mode = 0o755
                packed.addfile(info, io.BytesIO(member[1]))
            else:
                packed.addfile(member)
    return path


def _link(name: str, target: str, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def _environment(tmp_path: Path) -> Path:
    return _tar(tmp_path / "env.tar.gz", [
        _link("bin/python3.11", sys.executable), _link("bin/python3", "python3.11"),
        _link("bin/python", "python3.11"), ("lib/python3.11/site-packages/pkg.py", b"X = 1\n"),
        ("pyvenv.cfg", b"home = /usr/bin\n"),
    ])


def test_an_archive_is_unpacked_once_under_its_digest(tmp_path):
    archive = _environment(tmp_path)
    root = tmp_path / "environments"
    first = unpack_environment(archive, root)
    assert first.parent == root and len(first.name) == 32
    assert (first / "lib/python3.11/site-packages/pkg.py").read_text() == "X = 1\n"
    assert interpreter(first) == first / "bin/python3"
    marker = (first / "lib/python3.11/site-packages/pkg.py").stat().st_mtime_ns
    assert unpack_environment(archive, root) == first  # the second load finds it
    assert (first / "lib/python3.11/site-packages/pkg.py").stat().st_mtime_ns == marker
    assert [p.name for p in root.iterdir()] == [first.name]  # no scratch directory left


def test_a_zip_archive_is_unpacked_too(tmp_path):
    archive = tmp_path / "env.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        packed.writestr("lib/x.py", "Y = 2\n")
    assert (unpack_environment(archive, tmp_path / "root") / "lib/x.py").read_text() == "Y = 2\n"


@pytest.mark.parametrize("members, words", [
    ([("../escaped", b"x")], "a path outside the environment"),
    ([("/etc/escaped", b"x")], "a path outside the environment"),
    ([_link("lib/out", "../../../etc")], "a link out of the environment"),
    ([_link("lib/out", "/etc/passwd")], "a link out of the environment"),
    ([_link("bin/python", "/nonexistent/python3")], "which must exist here"),
    ([_link("lib/hard", "../../etc/passwd", hard=True)], "a path outside the environment"),
    ([_link("bin/python3.11", sys.executable), ("bin/python3.11", b"#!/bin/sh\n")], "twice or through a link"),
    ([_link("lib/dir", "site"), ("lib/dir/evil.py", b"x")], "twice or through a link"),
])
def test_a_hostile_archive_is_refused_and_leaves_nothing(tmp_path, members, words):
    archive = _tar(tmp_path / "evil.tar.gz", members)
    root = tmp_path / "root"
    with pytest.raises(BrokenEnvironment, match=words) as refused:
        unpack_environment(archive, root)
    assert str(archive) in str(refused.value)  # the message names the file
    assert list(root.iterdir()) == []
    assert not (tmp_path / "escaped").exists()


def test_a_device_file_is_refused(tmp_path):
    device = tarfile.TarInfo("dev/null")
    device.type = tarfile.CHRTYPE
    with pytest.raises(BrokenEnvironment, match="device or FIFO"):
        unpack_environment(_tar(tmp_path / "dev.tar.gz", [device]), tmp_path / "root")


def test_a_broken_archive_names_the_file(tmp_path):
    whole = _environment(tmp_path).read_bytes()
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(BrokenEnvironment, match=f"{broken}.*cannot be unpacked"):
        unpack_environment(broken, tmp_path / "root")
    assert list((tmp_path / "root").iterdir()) == []
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(os.urandom(256))
    with pytest.raises(BrokenEnvironment, match="junk.tar.gz"):
        unpack_environment(junk, tmp_path / "root")


def test_an_environment_without_python_says_what_it_needs(tmp_path):
    with pytest.raises(BrokenEnvironment, match="no bin/python3 or bin/python"):
        interpreter(tmp_path)
