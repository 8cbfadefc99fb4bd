"""``FloodMeter``: a token bucket per kind of frame; past its allowance a connection is cut off with
ENHANCE_YOUR_CALM, and frames counted in a bunch cost what as many counted one by one cost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.floods import Flood, FloodLimit, FloodMeter

_LIMITS = {kind: FloodLimit(10, 2.0) for kind in Flood}


def test_the_burst_is_allowed_and_the_frame_after_it_refused():
    meter = FloodMeter(0.0, _LIMITS)
    for _ in range(10):
        meter.count(Flood.PING, 0.0)
    with pytest.raises(f.FrameError) as refused:
        meter.count(Flood.PING, 0.0)
    assert refused.value.code == f.Error.ENHANCE_YOUR_CALM and "more than 10 PING" in str(refused.value)


def test_the_allowance_refills_at_its_rate_up_to_the_burst():
    meter = FloodMeter(0.0, _LIMITS)
    for _ in range(10):
        meter.count(Flood.SETTINGS, 0.0)
    meter.count(Flood.SETTINGS, 0.5)  # one frame back after half a second at 2 a second
    with pytest.raises(f.FrameError):
        meter.count(Flood.SETTINGS, 0.5)
    for _ in range(10):  # long idle: the burst again, never more
        meter.count(Flood.SETTINGS, 100.0)


@given(bunch=st.integers(1, 12), times=st.lists(st.integers(0, 12).map(lambda half: half / 2), min_size=1,
                                                max_size=12))
def test_a_bunch_is_refused_where_as_many_frames_counted_alone_would_be(bunch, times):
    """Counting ``bunch`` frames at once refuses exactly where counting them one by one at that moment
    refuses by the last of them (at half seconds: the allowance refills by whole frames, so both sums are
    exact and no rounding decides a refusal)."""
    alone, together = FloodMeter(0.0, _LIMITS), FloodMeter(0.0, _LIMITS)
    for now in sorted(times):
        refused_alone = False
        try:
            for _ in range(bunch):
                alone.count(Flood.WINDOW_UPDATE, now)
        except f.FrameError:
            refused_alone = True
        try:
            together.count(Flood.WINDOW_UPDATE, now, bunch)
        except f.FrameError:
            assert refused_alone
            return
        assert not refused_alone
