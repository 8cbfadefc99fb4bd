"""Packed environments unpacked once, by digest, and nothing of a hostile archive outside its directory."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_cache.environments import BrokenEnvironment, UnpackLimits, interpreter, unpack_environment


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


def _state_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A daemon's state dir with its control token (0600), and where environments unpack inside it."""
    state = tmp_path / "state"
    (state / "cache" / "environments").mkdir(parents=True)
    token = state / "auth-token"
    token.write_text("secret\n")
    token.chmod(0o600)
    return state / "cache" / "environments", token


# a -> ., b -> a/.., c -> b/.., d -> c/..: read on disk, d is the state dir (4 levels above the scratch dir).
_CHAIN = [_link("a", "."), _link("b", "a/.."), _link("c", "b/.."), _link("d", "c/..")]


@pytest.mark.parametrize("through", [
    _link("token", "d/auth-token", hard=True),
    ("d/auth-token", b"overwritten\n"),
    _link("e", "d/auth-token"),
], ids=["hard-link", "file", "symlink"])
def test_a_symlink_chain_out_of_the_environment_is_refused_and_changes_nothing(tmp_path, through):
    root, token = _state_dir(tmp_path)
    before = token.stat()
    with pytest.raises(BrokenEnvironment, match="'b', a link out of the environment"):
        unpack_environment(_tar(tmp_path / "chain.tar.gz", [*_CHAIN, through]), root)
    after = token.stat()
    assert (after.st_mode, after.st_nlink, after.st_ino) == (before.st_mode, before.st_nlink, before.st_ino)
    assert token.read_text() == "secret\n"
    assert list(root.iterdir()) == []
    assert sorted(p.name for p in token.parent.iterdir()) == ["auth-token", "cache"]


def _fake_interpreter(directory: Path) -> Path:
    """An executable standing in for the system's Python, so that a regression harms only the test's file."""
    python = directory / "python3.11"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_a_file_over_the_interpreter_link_is_refused(tmp_path):
    python = _fake_interpreter(tmp_path)
    members = [_link("bin/python3.11", str(python)), ("bin/python3.11", b"#!/bin/sh\nexit 1\n")]
    with pytest.raises(BrokenEnvironment, match="twice or through a link"):
        unpack_environment(_tar(tmp_path / "over.tar.gz", members), tmp_path / "root")
    assert python.read_text() == "#!/bin/sh\n"


def test_a_hard_link_to_the_interpreter_link_is_refused(tmp_path):
    # os.link follows a link: the hard link would be the interpreter itself, chmod-ed by the unpack.
    python = _fake_interpreter(tmp_path)
    members = [_link("bin/python", str(python)), _link("bin/python-copy", "bin/python", hard=True)]
    with pytest.raises(BrokenEnvironment, match="'bin/python-copy', a (hard )?link .*'bin/python'.* refused"):
        unpack_environment(_tar(tmp_path / "hard.tar.gz", members), tmp_path / "root")
    assert (python.stat().st_mode & 0o777, python.stat().st_nlink) == (0o755, 1)


@pytest.mark.parametrize("name, target", [
    ("lib/libpython3.so", sys.executable),
    ("bin/python-evil", sys.executable),
    ("bin/python3", "plain.txt"),  # not an interpreter (not executable)
])
def test_only_the_interpreter_link_may_be_absolute(tmp_path, name, target):
    (tmp_path / "plain.txt").write_text("not a program\n")
    (tmp_path / "plain.txt").chmod(0o644)
    target = str(tmp_path / target) if target == "plain.txt" else target
    with pytest.raises(BrokenEnvironment, match=f"{name!r}, a link out of the environment"):
        unpack_environment(_tar(tmp_path / "abs.tar.gz", [_link(name, target)]), tmp_path / "root")


def test_a_venv_pack_archive_with_pyvenv_cfg_twice_is_unpacked_the_last_one_winning(tmp_path):
    # venv-pack 0.2.0 adds pyvenv.cfg, then the rewritten one, to the same tar.
    archive = _tar(tmp_path / "venv.tar.gz", [
        ("pyvenv.cfg", b"home = /build/bin\n"), _link("bin/python", sys.executable), _link("bin/python3", "python"),
        _link("bin/python3.11", "python"), ("lib/python3.11/site-packages/pkg.py", b"X = 1\n"),
        ("pyvenv.cfg", b"home = /usr/bin\ninclude-system-site-packages = false\n"),
    ])
    unpacked = unpack_environment(archive, tmp_path / "root")
    assert (unpacked / "pyvenv.cfg").read_text() == "home = /usr/bin\ninclude-system-site-packages = false\n"
    assert interpreter(unpacked).resolve() == Path(sys.executable).resolve()


def test_the_unpacked_size_is_bounded_before_anything_is_written_past_it(tmp_path):
    members = [(f"lib/part{i}.bin", b"x" * 600) for i in range(3)]
    with pytest.raises(BrokenEnvironment, match=r"more than 1000 bytes \(environment_max_unpacked_bytes\) at "
                                                "'lib/part1.bin'"):
        unpack_environment(_tar(tmp_path / "big.tar.gz", members), tmp_path / "root",
                           UnpackLimits(max_unpacked_bytes=1000))
    assert list((tmp_path / "root").iterdir()) == []
    assert unpack_environment(_tar(tmp_path / "fits.tar.gz", members[:1]), tmp_path / "root",
                              UnpackLimits(max_unpacked_bytes=1000)).is_dir()


def test_a_header_declaring_a_terabyte_is_refused_without_reading_further(tmp_path):
    bomb = tarfile.TarInfo("lib/bomb.bin")
    bomb.size = 1 << 40
    archive = tmp_path / "bomb.tar"
    archive.write_bytes(bomb.tobuf(tarfile.GNU_FORMAT))  # the header alone: no data follows
    with pytest.raises(BrokenEnvironment, match="unpacks to more than 8589934592 bytes"):
        unpack_environment(archive, tmp_path / "root")


def test_the_member_count_is_bounded(tmp_path):
    members = [(f"lib/m{i}.py", b"") for i in range(6)]
    with pytest.raises(BrokenEnvironment, match=r"more than 5 members \(environment_max_members\)"):
        unpack_environment(_tar(tmp_path / "many.tar.gz", members), tmp_path / "root", UnpackLimits(max_members=5))
    zipped = tmp_path / "many.zip"
    with zipfile.ZipFile(zipped, "w") as packed:
        for name, data in members:
            packed.writestr(name, data)
    with pytest.raises(BrokenEnvironment, match="more than 5 members"):
        unpack_environment(zipped, tmp_path / "root", UnpackLimits(max_members=5))
    assert list((tmp_path / "root").iterdir()) == []


def test_a_huge_pax_header_is_refused_before_it_is_read_whole(tmp_path):
    info = tarfile.TarInfo("lib/x.py")
    info.pax_headers = {"comment": "x" * (2 << 20)}
    with tarfile.open(tmp_path / "pax.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as packed:
        packed.addfile(info, io.BytesIO())
    with pytest.raises(BrokenEnvironment, match="a header of .* bytes, more than the 1048576 allowed"):
        unpack_environment(tmp_path / "pax.tar.gz", tmp_path / "root")


def test_unpacking_logs_its_size_and_time(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="model_cache.environments"):
        unpack_environment(_environment(tmp_path), tmp_path / "root")
    assert re.search(r"unpacked the environment archive .*env\.tar\.gz: 5 members, [0-9.]+ MiB in [0-9.]+ s",
                     caplog.text)


# -- any archive: nothing outside the environment is ever written ----------------------------------------

_DEPTH = 40  # deeper than the links of one archive can climb (8 of 4 '..' each), so an escape lands where it is seen
_PARTS = st.sampled_from(["a", "b", "x", "bin", "python", "..", ".", ""])
_NAMES = st.builds(lambda lead, parts: lead + "/".join(parts), st.sampled_from(["", "", "", "/", "./"]),
                   st.lists(_PARTS, min_size=1, max_size=4))
_PYTHON = "<python>"  # an executable of the test's own (a regression must never chmod the real interpreter)
_TARGETS = st.one_of(_NAMES, st.sampled_from([_PYTHON, "/", "/etc/hostname", "x"]))
_MEMBERS = st.lists(st.one_of(
    st.tuples(st.just("file"), _NAMES, st.binary(max_size=8)),
    st.tuples(st.just("dir"), _NAMES, st.just(b"")),
    st.tuples(st.just("sym"), _NAMES, _TARGETS),
    st.tuples(st.just("hard"), _NAMES, _TARGETS),
), max_size=8)


def _snapshot(top: Path, skip: Path) -> dict[str, tuple]:
    seen = {}
    for path in sorted(top.rglob("*")):
        if path == skip or skip in path.parents or path.name == "archive.tar":
            continue
        info = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        seen[str(path.relative_to(top))] = (info.st_mode, info.st_nlink, info.st_ino, info.st_mtime_ns, content)
    return seen


def _member(kind: str, name: str, payload, python: Path) -> tarfile.TarInfo | tuple[str, bytes]:
    if payload == _PYTHON:
        payload = str(python)
    if kind == "file":
        return (name, payload)
    if kind == "dir":
        info = tarfile.TarInfo(name)
        info.type = tarfile.DIRTYPE
        info.mode = 0o777
        return info
    return _link(name, payload, hard=kind == "hard")


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(top, the environments' root _DEPTH levels below it, an interpreter of the test's own), with files
    named like the archives' names at every level in between."""
    top = level = tmp_path_factory.mktemp("deep")
    for depth in range(_DEPTH):
        level = level / f"d{depth}"
        level.mkdir()
        for name in ("x", "a"):
            (level / name).write_text(f"level {depth}\n")
            (level / name).chmod(0o600)
    (level / "environments").mkdir()
    return top, level / "environments", _fake_interpreter(top)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(members=_MEMBERS)
def test_no_archive_writes_outside_its_environment(deep, members):
    top, root, python = deep
    archive = top / "archive.tar"
    try:
        _tar(archive, [_member(*m, python) for m in members])
    except (ValueError, OSError):  # a member tarfile itself will not write
        return
    before = _snapshot(top, root)
    try:
        unpacked = unpack_environment(archive, root)
    except BrokenEnvironment:
        assert list(root.iterdir()) == []
    else:
        real = os.path.realpath(unpacked)
        for path in unpacked.rglob("*"):
            if path.is_symlink():
                resolved = os.path.realpath(path)
                assert resolved == real or resolved.startswith(real + os.sep) or resolved == str(python), \
                    (path, resolved)
        shutil.rmtree(unpacked)
    finally:
        archive.unlink()
    assert _snapshot(top, root) == before
