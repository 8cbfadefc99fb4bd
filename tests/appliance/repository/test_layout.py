"""A model version's files as its digest sees them: every file the model can read (helper modules
included, by content), no derived or other-version files, links only inside the model's directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from appliance.core.errors import ConfigError
from appliance.repository import layout
from appliance.repository.layout import content_digest, file_digests

CONFIG = b"serialized config"


def _model(root: Path) -> Path:
    """A Python model ``m`` with a helper package beside its versions, as Triton users lay them out."""
    model = root / "m"
    (model / "1").mkdir(parents=True)
    (model / "lib").mkdir()
    (model / "config.pbtxt").write_text('backend: "python"\n')
    (model / "1" / "model.py").write_text("from lib.helper import VALUE\n")
    (model / "lib" / "helper.py").write_text("VALUE = 1\n")
    return model


def _digest(model: Path, version: str = "1") -> bytes:
    return content_digest(model, model / version, CONFIG)


def test_editing_a_helper_module_changes_the_digest_even_with_its_size_and_mtime_kept(tmp_path):
    model = _model(tmp_path)
    helper = model / "lib" / "helper.py"
    before, names = _digest(model), file_digests(model, model / "1")
    assert sorted(names) == ["1/model.py", "config.pbtxt", "lib/helper.py"]
    kept = helper.stat()
    helper.write_text("VALUE = 2\n")  # same size
    os.utime(helper, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert _digest(model) != before
    helper.write_text("VALUE = 1\n")
    assert _digest(model) == before  # content, not when it was written
    assert content_digest(model, model / "1", b"another config") != before


def test_hidden_files_count_but_not_bytecode_nor_the_other_versions(tmp_path):
    model = _model(tmp_path)
    before = _digest(model)
    (model / "lib" / "__pycache__").mkdir()
    (model / "lib" / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"derived")
    (model / "2").mkdir()
    (model / "2" / "model.py").write_text("other version\n")
    assert _digest(model) == before  # a new version does not invalidate version 1's plans and answers
    assert "1/model.py" not in file_digests(model, model / "2")
    (model / ".weights").write_bytes(b"read by the model")
    assert _digest(model) != before


def test_a_link_inside_the_model_is_followed(tmp_path):
    model = _model(tmp_path)
    (model / "2" / "data").mkdir(parents=True)
    (model / "2" / "data" / "table.txt").write_text("1 2 3\n")
    (model / "1" / "data").symlink_to("../2/data", target_is_directory=True)  # into another version: walked
    (model / "1" / "lib").symlink_to("../lib", target_is_directory=True)
    (model / "1" / "loop").symlink_to("..", target_is_directory=True)  # walked once, not forever
    names = file_digests(model, model / "1")
    assert names["1/lib"] == "link:lib"
    assert "lib/helper.py" in names  # a directory's files are listed once, where the walk first meets them
    assert names["1/loop"] == "link:."
    assert "1/data/table.txt" in names
    before = _digest(model)
    (model / "lib" / "helper.py").write_text("VALUE = 3\n")
    assert _digest(model) != before
    before = _digest(model)
    (model / "2" / "data" / "table.txt").write_text("4 5 6\n")
    assert _digest(model) != before


@pytest.mark.parametrize("target, words", [
    ("/etc/hostname", "outside the model's directory"),
    ("../../elsewhere.py", "outside the model's directory"),
    ("missing.py", "cannot be followed"),
    ("loop.py", "cannot be followed"),
])
def test_a_link_leaving_the_model_or_going_nowhere_fails_the_load(tmp_path, target, words):
    model = _model(tmp_path)
    (tmp_path / "elsewhere.py").write_text("SECRET = 1\n")
    (model / "lib" / "loop.py").symlink_to("loop.py") if target == "loop.py" else None
    (model / "lib" / "out.py").symlink_to(target)
    with pytest.raises(ConfigError, match=f"model 'm': lib/(out|loop).py is a link .*{words}"):
        _digest(model)


def test_a_fifo_is_named_never_opened(tmp_path):
    model = _model(tmp_path)
    os.mkfifo(model / "lib" / "pipe")
    assert file_digests(model, model / "1")["lib/pipe"].startswith("special:")  # would hang if opened


def test_a_model_of_too_many_files_fails_with_the_limit_named(tmp_path, monkeypatch):
    model = _model(tmp_path)
    monkeypatch.setattr(layout, "MAX_MODEL_ENTRIES", 5)
    assert len(file_digests(model, model / "1")) == 3  # five entries: 1/, 1/model.py, config.pbtxt, lib/, its helper
    (model / "lib" / "more.py").write_text("")
    with pytest.raises(ConfigError, match="more than 5 files and directories"):
        file_digests(model, model / "1")
