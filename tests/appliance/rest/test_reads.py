"""appliance.rest.reads: the reads both HTTP paths serve are answered once, from the data plane."""

from __future__ import annotations

import pytest

from appliance.protocol.operations import Operation
from appliance.rest.reads import MODEL_NOT_READY, READS, answer_read


class Plane:
    """The part of the data plane the reads ask."""

    def __init__(self, live: bool = True, ready: bool = True, served: bool = True) -> None:
        self._live, self._ready, self._served = live, ready, served

    def live(self) -> bool:
        return self._live

    def ready(self) -> bool:
        return self._ready

    def model_ready(self, model: str, version: str | None) -> bool:
        return self._served


@pytest.mark.parametrize(("plane", "operation", "answer"), [
    (Plane(), Operation.SERVER_LIVE, (200, None, None)),
    (Plane(live=False), Operation.SERVER_LIVE, (503, None, None)),
    (Plane(ready=False), Operation.SERVER_READY, (503, None, None)),
    (Plane(), Operation.MODEL_READY, (200, None, None)),
    (Plane(served=False), Operation.MODEL_READY, (400, None, MODEL_NOT_READY)),
])
def test_health_and_readiness(plane, operation, answer):
    assert answer_read(plane, operation, "m", None) == answer  # type: ignore[arg-type]


def test_only_reads_are_answered():
    assert Operation.INFER not in READS
    with pytest.raises(ValueError, match="not a read"):
        answer_read(Plane(), Operation.INFER)  # type: ignore[arg-type]
