"""Timing helpers: every instance busy at once, and their errors reported."""

from __future__ import annotations

import threading

import pytest

from appliance.selection.measure import rate_concurrent


def test_every_run_loops_at_the_same_time_as_the_others():
    meeting = threading.Barrier(2, timeout=10)  # broken (and raised) unless both loops run at once
    calls = [0, 0]

    def run(index: int) -> None:
        calls[index] += 1
        if calls[index] == 2:  # the first timed call of each
            meeting.wait()

    assert rate_concurrent([lambda: run(0), lambda: run(1)], 0.01) > 0
    assert min(calls) >= 2


def test_an_error_in_any_run_is_raised():
    calls = []

    def failing() -> None:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("instance 1 broke")

    with pytest.raises(RuntimeError, match="instance 1 broke"):
        rate_concurrent([lambda: None, failing], 0.01)
