"""The metrics service's tick stamps: one boundary a tick, never the last tick's again."""

from __future__ import annotations

from appliance.metrics.service import tick_stamp


def test_a_tick_is_stamped_with_the_boundary_it_lies_in():
    assert tick_stamp(1000.0004, 1.0, None) == 1000
    assert tick_stamp(1001.0002, 1.0, 1000) == 1001
    assert tick_stamp(1005.2, 5.0, 1000) == 1005


def test_a_tick_woken_before_its_boundary_does_not_reuse_the_last_stamp():
    """Woken at 1000.9995 for the 1001 boundary: stamped 1001, not 1000, whose row it would replace."""
    assert tick_stamp(1000.9995, 1.0, 1000) == 1001
    assert tick_stamp(1004.999, 5.0, 1000) == 1005


def test_stamps_keep_rising_when_the_wall_clock_steps_back():
    assert tick_stamp(990.0, 1.0, 1000) == 1001
