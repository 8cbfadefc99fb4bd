"""The Python models the tests serve, written as Triton users write them (model.py sources and
config.pbtxt text), and the one writer that puts such a model into a repository.

- ``simple``: single models: Triton's add_sub, a numpy CNN, the failure modes (raises, wrong response
  count, process exits, error responses) and ``sleepy``.
- ``pipelines``: models calling models (BLS sync, async, decoupled, a driver with no inputs), the
  pb_utils surface (request fields, Logger, custom metrics) and error codes.
- ``decoupled``: decoupled models (``repeat``, ``endless``, ``words``) and the streaming repository.
- ``sequence``: the stateful models Triton's sequence client examples call.
- ``iterative``: models that reschedule their requests (iterative sequences).

ONNX models are built in ``tests.builders``; models only one test module uses stay in that module."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

__all__ = ["write_python_model"]


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
