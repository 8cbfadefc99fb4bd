"""Decoupled Python models (model_transaction_policy { decoupled: true }) for the streaming tests, written
as Triton's own decoupled examples are (files under tests/models/decoupled/: ``repeat``, ``endless``,
``words``; read as text here for ``write_python_model``), and a repository holding them with an ONNX model
beside."""

from __future__ import annotations

from pathlib import Path

from appliance.examples import build_example_repository
from tests.models import MODELS, copy_model

_DECOUPLED = MODELS / "decoupled"

REPEAT = (_DECOUPLED / "repeat" / "model.py").read_text()
REPEAT_CONFIG = (_DECOUPLED / "repeat" / "config.pbtxt").read_text()
ENDLESS = (_DECOUPLED / "endless" / "model.py").read_text()
ENDLESS_CONFIG = (_DECOUPLED / "endless" / "config.pbtxt").read_text()
WORDS = (_DECOUPLED / "words" / "model.py").read_text()
WORDS_CONFIG = (_DECOUPLED / "words" / "config.pbtxt").read_text()


def build_streaming_repository(root: Path) -> Path:
    """The example repository (``simple`` is an ONNX model that answers once) plus the decoupled models."""
    repo = build_example_repository(root)
    for name in ("repeat", "endless", "words"):
        copy_model(repo, f"decoupled/{name}")
    return repo
