"""What a probe step is, and the section it returns when the thing it looks for is not there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RUNTIME_IMPORTS", "Step", "absent"]

RUNTIME_IMPORTS = threading.Lock()
"""Held by every step while it imports or calls a runtime (onnx, onnxruntime, OpenVINO, torch): steps run on
threads at once, and two threads importing the same package (numpy under all of them) can see it partly
initialised, which made every runtime read as absent now and then on a loaded box."""


@dataclass(frozen=True)
class Step:
    """One probe step: `run` returns a JSON-serialisable dict, the report's section called `name`.

    The dict carries "status": "present" or "absent" (then with a "reason"); a dict without a
    status is taken as present.
    """

    name: str
    run: Callable[[], dict]


def absent(reason: str, **details: object) -> dict:
    """An absent section; `details` keep what was found on the way (say OpenVINO's device list)."""
    return {"status": "absent", "reason": reason, **details}
