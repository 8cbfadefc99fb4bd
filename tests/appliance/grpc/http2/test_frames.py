"""HTTP/2 framing: frame headers, SETTINGS, padding."""

from __future__ import annotations

import pytest

from appliance.grpc.http2 import frames as f


def test_a_frame_is_its_nine_byte_head_and_payload():
    data = f.frame(f.HEADERS, f.END_HEADERS, 3, b"abc")
    assert data == b"\x00\x00\x03\x01\x04\x00\x00\x00\x03abc"
    word, flags, stream = f.HEAD.unpack_from(data)
    assert (word >> 8, word & 0xFF, flags, stream) == (3, f.HEADERS, f.END_HEADERS, 3)


def test_settings_round_trip_and_bad_ones_are_refused():
    payload = f.settings({f.INITIAL_WINDOW_SIZE: 100, f.MAX_FRAME_SIZE: 20_000})[9:]
    assert f.parse_settings(payload) == {f.INITIAL_WINDOW_SIZE: 100, f.MAX_FRAME_SIZE: 20_000}
    with pytest.raises(f.FrameError) as error:
        f.parse_settings(payload[:5])
    assert error.value.code == f.Error.FRAME_SIZE_ERROR
    with pytest.raises(f.FrameError):
        f.parse_settings(f.settings({f.ENABLE_PUSH: 2})[9:])
    with pytest.raises(f.FrameError) as error:
        f.parse_settings(f.settings({f.INITIAL_WINDOW_SIZE: 2**31})[9:])
    assert error.value.code == f.Error.FLOW_CONTROL_ERROR
    with pytest.raises(f.FrameError):
        f.parse_settings(f.settings({f.MAX_FRAME_SIZE: 100})[9:])


def test_padding_is_taken_off_and_too_much_of_it_is_a_protocol_error():
    assert f.unpadded(b"\x02abcXY", f.PADDED) == b"abc"
    assert f.unpadded(b"abc", 0) == b"abc"
    for bad in (b"", b"\x05abc"):
        with pytest.raises(f.FrameError):
            f.unpadded(bad, f.PADDED)
