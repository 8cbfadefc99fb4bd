"""What a probe step is, and the section it returns when the thing it looks for is not there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Step", "absent"]


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
