"""The Python models the tests serve, written as Triton users write them (model.py sources and
config.pbtxt text), and the one writer that puts such a model into a repository.

- ``simple``: single models: Triton's add_sub, a numpy CNN, the failure modes (raises, wrong response
  count, process exits, error responses) and ``sleepy``.
- ``pipelines``: models calling models (BLS sync, async, decoupled, a driver with no inputs), the
  pb_utils surface (request fields, Logger, custom metrics) and error codes.
- ``decoupled``: decoupled models (``repeat``, ``endless``, ``words``) and the streaming repository.
- ``sequence``: the stateful models Triton's sequence client examples call.
- ``iterative``: models that reschedule their requests (iterative sequences).

Models kept as real files (linted like code) live in directories under this package, one per model
(``<group>/<name>/model.py`` plus its ``config.pbtxt``): ``copy_model`` puts one into a repository.

ONNX models are built in ``tests.builders``; models only one test module uses stay in that module."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MODELS", "copy_model", "read_config", "write_python_model"]

MODELS = Path(__file__).resolve().parent
"""tests/models: the directories ``copy_model`` reads."""


def write_python_model(repo: Path, name: str, source: str, config: str, *, version: int = 1,
                       files: Mapping[str, str] | None = None) -> Path:
    """``repo/name/config.pbtxt`` and ``repo/name/<version>/model.py`` (plus ``files`` beside it), each text
    dedented; returns the model.py path."""
    directory = repo / name / str(version)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.py").write_text(textwrap.dedent(source))
    for filename, text in (files or {}).items():
        (directory / filename).write_text(textwrap.dedent(text))
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return directory / "model.py"


def copy_model(repo: Path, source: str, name: str | None = None, version: int = 1, *,
               config: str = "config") -> Path:
    """``repo/<name>/<version>/model.py`` (with every other file of the directory but its ``.pbtxt`` configs
    beside it) and ``repo/<name>/config.pbtxt`` from the model directory ``tests/models/<source>``; ``name``
    defaults to the directory's own name, ``config`` picks a variant ``<config>.pbtxt`` of the directory.
    Returns the model.py path."""
    directory = MODELS / source
    if not (directory / "model.py").is_file() or not (directory / f"{config}.pbtxt").is_file():
        raise FileNotFoundError(f"no model at {directory}: expected model.py and {config}.pbtxt there")
    target = repo / (name or directory.name) / str(version)
    target.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        if path.is_file() and path.suffix not in (".pbtxt", ".pyc"):
            shutil.copyfile(path, target / path.name)
    shutil.copyfile(directory / f"{config}.pbtxt", target.parent / "config.pbtxt")
    return target / "model.py"


def read_config(source: str, config: str = "config") -> str:
    """The text of ``tests/models/<source>/<config>.pbtxt``: the config a test parses as ``copy_model`` puts it."""
    return (MODELS / source / f"{config}.pbtxt").read_text()
