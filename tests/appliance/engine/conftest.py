from __future__ import annotations

import pytest


@pytest.fixture
async def started():
    """started(scheduler) -> the scheduler, started; every scheduler (plain or sequence) given is closed
    after the test, whatever the test got to."""
    made: list = []

    def start(scheduler):
        scheduler.start()
        made.append(scheduler)
        return scheduler

    yield start
    for scheduler in made:
        await scheduler.close()
