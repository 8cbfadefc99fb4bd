"""Decoupled Python models (model_transaction_policy { decoupled: true }) for the streaming tests, written
as Triton's own decoupled examples are (files under tests/models/decoupled/: ``repeat``, ``endless``,
``words``), and a repository holding them with an ONNX model beside."""

from __future__ import annotations

from pathlib import Path

from appliance.examples import build_example_repository
from tests.models import copy_model


def build_streaming_repository(root: Path) -> Path:
    """The example repository (``simple`` is an ONNX model that answers once) plus the decoupled models."""
    repo = build_example_repository(root)
    for name in ("repeat", "endless", "words"):
        copy_model(repo, f"decoupled/{name}")
    return repo
