"""The hostile model (tests/models/hostile): one model.py whose execute() misbehaves as each request's MODE
says, put into a repository under any name with one of its configs; and what Triton answers each way."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

__all__ = ["HOSTILE", "WRONG_RETURNS", "failed", "write_hostile"]

HOSTILE = Path(__file__).resolve().parents[3] / "models" / "hostile"

_FAILED = r"Failed to process the request\(s\) for model '{instance}', message: "
_COUNTS = r"Number of InferenceResponse objects do not match the number of InferenceRequest objects\. "
WRONG_RETURNS = {
    "raise": "RuntimeError: the hostile model raised",
    "none": re.escape("Expected a list in the execute return, found type '<class 'NoneType'>'."),
    "list_of_none": re.escape("Expected an 'InferenceResponse' object in the execute function return list, found "
                              "type '<class 'NoneType'>'."),
    "short": _COUNTS + r"InferenceRequest\(s\) size is:\d+, and InferenceResponse\(s\) size is:0\n",
    "long": _COUNTS + r"InferenceRequest\(s\) size is:(\d+), and InferenceResponse\(s\) size is:\d+\n",
    "string": re.escape("Expected a list in the execute return, found type '<class 'str'>'."),
    "dict": re.escape("Expected a list in the execute return, found type '<class 'dict'>'."),
    "list_of_string": re.escape("Expected an 'InferenceResponse' object in the execute function return list, "
                                "found type '<class 'str'>'."),
}
"""Each wrong return of a model that is not decoupled, and the pattern of Triton's message for it."""


def failed(instance: str, mode: str) -> str:
    """The pattern of the whole message a request gets when ``instance``'s execute() did ``mode``."""
    return _FAILED.format(instance=re.escape(instance)) + WRONG_RETURNS[mode]


def write_hostile(repo: Path, name: str, config: str = "config", extra: str = "") -> Path:
    """``repo/name`` serving the hostile model.py with ``tests/models/hostile/<config>.pbtxt`` (plus
    ``extra`` config text); returns its model.py."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    shutil.copyfile(HOSTILE / "model.py", version / "model.py")
    (repo / name / "config.pbtxt").write_text((HOSTILE / f"{config}.pbtxt").read_text() + extra)
    return version / "model.py"
