"""The built-in example repository, generated deterministically (fixed seeds, no network) on first use.

- ``simple``: Triton's quick-start model: INPUT0 + INPUT1 and INPUT0 - INPUT1 over INT32 [16], batched.
- ``simple_string``: the same over numbers written as strings (BYTES), as Triton's example.
- ``mlp``: a tiny 784->64->10 classifier with no config.pbtxt: its config is auto-completed.

The models are built with onnx in appliance.examples.models, imported only when they are generated:
a daemon whose example repository is already current, or that serves another, never imports onnx.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.runtime.state import StateDir

if TYPE_CHECKING:
    import onnx

__all__ = ["GENERATION", "build_example_repository", "ensure_example_repository", "example_repository",
           "mlp_model"]

# Bump when the generated models (appliance.examples.models) change, so existing state dirs regenerate them.
GENERATION = "1"


def build_example_repository(target: Path) -> Path:
    """Write the example repository into ``target`` (which must not exist yet)."""
    from appliance.examples import models

    models.build_example_repository(target)
    (target / ".generation").write_text(GENERATION)
    return target


def mlp_model(seed: int = 0, inputs: int = 784, hidden: int = 64, classes: int = 10) -> onnx.ModelProto:
    """A deterministic MLP classifier: input [batch, inputs] FP32 -> probabilities [batch, classes]."""
    from appliance.examples import models

    return models.mlp_model(seed, inputs, hidden, classes)


def ensure_example_repository(target: Path) -> Path:
    """Generate the repository once (atomically: build beside it, then rename) and return it."""
    stamp = target / ".generation"
    if stamp.is_file() and stamp.read_text() == GENERATION:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".example-", dir=target.parent))
    try:
        build_example_repository(staging / "repo")
        if target.exists():
            shutil.rmtree(target)
        (staging / "repo").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def example_repository(target: Path, state: StateDir) -> tuple[Path, Path | None]:
    """The example repository in ``target`` (generated once), and None; where ``target`` cannot be
    written (a read-only state dir without a current copy), one generated in a new temporary directory,
    and that directory, for the caller to remove when it stops serving."""
    try:
        return ensure_example_repository(target), None
    except OSError as exc:
        scratch = Path(tempfile.mkdtemp(prefix="appliance-examples-"))
        state.note("example_repository_temporary",
                   f"the example repository cannot be written to {target} ({exc.strerror or exc}): generated "
                   f"in {scratch} for this run instead",
                   "make the state dir writable, or serve your own repository (--model-repository)")
        return build_example_repository(scratch / "repo"), scratch
