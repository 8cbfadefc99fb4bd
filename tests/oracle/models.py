"""The repository of Python-backend models that real Triton and the appliance both serve.

Triton's wheel carries only the Python backend, so every model here is a model.py written as
NVIDIA's examples are. Each one exists for a part of the protocol the corpus exercises; they are files
under tests/models/oracle/ (``identity``'s config.pbtxt labels its output, unlabelled.pbtxt does not).
"""

from __future__ import annotations

from pathlib import Path

from tests.models import MODELS as _MODELS
from tests.models import copy_model

__all__ = ["ADD_SUB", "ADD_SUB_CONFIG", "IDENTITY", "IDENTITY_CONFIG", "LABELLED_CONFIG", "LABELS", "MODELS",
           "write_python_model", "write_repository"]

_ORACLE = _MODELS / "oracle"

IDENTITY = (_ORACLE / "identity" / "model.py").read_text()
IDENTITY_CONFIG = (_ORACLE / "identity" / "unlabelled.pbtxt").read_text()
LABELLED_CONFIG = (_ORACLE / "identity" / "config.pbtxt").read_text()
"""The corpus's identity: its output has labels (labels.txt beside config.pbtxt), for classification."""
LABELS = (_ORACLE / "labels.txt").read_text()
"""The labels, kept outside the model directory: they go beside config.pbtxt, not beside model.py."""
ADD_SUB = (_ORACLE / "add_sub" / "model.py").read_text()
ADD_SUB_CONFIG = (_ORACLE / "add_sub" / "config.pbtxt").read_text()

MODELS: dict[str, str] = {
    "identity": "identity",
    "add_sub": "add_sub",
    "double": "double",
    "strings": "strings",
    "text": "text",
    "repeat": "repeat",
    "accumulator": "accumulator",
    "fails": "fails",
    # A second copy of identity: unloaded and loaded again by the corpus while the rest keeps serving.
    "spare": "identity",
    # Copies that only the statistics cases call, so their counts do not hang on every other case.
    "counted": "fails_or_echo",
    "counted_repeat": "repeat",
}
"""name in the repository -> its directory under tests/models/oracle/; the ensemble ``pipeline`` comes on top."""


def write_python_model(repository: Path, name: str, source: str, config: str, version: int = 1) -> Path:
    """repository/name/config.pbtxt and repository/name/<version>/model.py; returns the model directory."""
    model = repository / name
    (model / str(version)).mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(config.strip() + "\n")
    (model / str(version) / "model.py").write_text(source.lstrip())
    return model


def write_repository(repository: Path) -> Path:
    """Every model above, the labels file, and the ensemble ``pipeline`` (add_sub then double)."""
    for name, source in MODELS.items():
        copy_model(repository, f"oracle/{source}", name)
    for name in ("identity", "spare"):
        (repository / name / "labels.txt").write_text(LABELS)
    (repository / "pipeline" / "1").mkdir(parents=True, exist_ok=True)
    (repository / "pipeline" / "config.pbtxt").write_text((_ORACLE / "pipeline" / "config.pbtxt").read_text())
    return repository
