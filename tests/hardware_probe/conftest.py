"""One real probe of this box, shared: importing torch and opening sessions takes a second or two."""

from __future__ import annotations

import pytest

from hardware_probe import ProbeReport, probe


@pytest.fixture(scope="session")
def report() -> ProbeReport:
    # Generous: a cold torch import on a busy CI runner can take several seconds.
    return probe(timeout=60)
