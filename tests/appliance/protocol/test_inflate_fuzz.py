"""Property-based fuzzing of the one inflater of compressed requests (``appliance.protocol.inflate``): REST
bodies under Content-Encoding and gRPC messages under grpc-encoding.

Properties: what was compressed (gzip, with any number of members; deflate, zlib-wrapped or raw) comes
back exactly; damaged data (truncated, flipped, extended, overwritten) is refused with the protocol's own
error (400, or 413 past the limits) or inflated within ``InflateLimits.cap``, and a gzip member with a
changed byte is never read as other data; the request's account holds exactly the output after a
success and nothing after a refusal, and no more is allocated than the cap allows.
"""

from __future__ import annotations

import gzip
import threading
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol.inflate import InflateLimits, inflate
from appliance.security.budget import MemoryBudget
from tests.appliance.strategies_fuzz import assert_client_error, measure_peak, mutated

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of stalling CI

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(FUZZ, max_examples=50)


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


_COMPRESSORS = {
    "gzip": lambda parts: b"".join(gzip.compress(part) for part in parts),  # one member per part
    "deflate": lambda parts: zlib.compress(b"".join(parts)),
    "raw deflate": lambda parts: _raw_deflate(b"".join(parts)),
}
_PAYLOADS = st.lists(st.binary(max_size=200) | st.binary(max_size=4).map(lambda b: b * 500), min_size=1, max_size=3)
_LIMITS = st.builds(InflateLimits, st.sampled_from([1 << 10, 1 << 16, 1 << 21]), st.sampled_from([0, 2, 200]))


def _inflate(data: bytes, coding: str, limits: InflateLimits) -> tuple[bytes | None, int]:
    """Inflate on a fresh account: the output (None when refused) and the peak allocation; the account
    holds exactly the output, or nothing once refused."""
    with MemoryBudget(1 << 30).account() as account, measure_peak() as peak:
        try:
            out = inflate(data, coding, limits, account)
        except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
            assert_client_error(exc)
            assert account.held == 0
            out = None
        else:
            assert len(out) <= limits.cap(len(data))
            assert account.held == len(out)
        account.close()
    return out, peak[0]


@FUZZ
@given(parts=_PAYLOADS, kind=st.sampled_from(sorted(_COMPRESSORS)))
def test_compressed_data_inflates_to_what_was_compressed(parts, kind):
    data = _COMPRESSORS[kind](parts)
    out, _ = _inflate(data, "gzip" if kind == "gzip" else "deflate", InflateLimits(1 << 21, 0))
    assert out == b"".join(parts)


@FUZZ
@given(parts=_PAYLOADS, kind=st.sampled_from(sorted(_COMPRESSORS)), limits=_LIMITS, data=st.data())
def test_damaged_compressed_data_is_inflated_or_refused_within_the_cap(parts, kind, limits, data):
    """Truncated, flipped, extended, overwritten: a 400 or 413, or data within the cap (deflate may read
    other bytes as other valid data), on an account that holds what it returned."""
    damaged = data.draw(mutated(_COMPRESSORS[kind](parts)))
    _, peak = _inflate(damaged, "gzip" if kind == "gzip" else "deflate", limits)
    assert peak <= 3 * limits.cap(len(damaged)) + 64 * len(damaged) + 256 * 1024


@FUZZ
@given(part=_PAYLOADS.map(b"".join), data=st.data())
def test_a_gzip_member_with_a_byte_changed_inflates_to_the_original_or_is_refused(part, data):
    """gzip's CRC-32 and length: a changed byte is never read as other data (a changed time stamp or OS
    byte in the header is no change to the data)."""
    member = bytearray(gzip.compress(part))
    at = data.draw(st.integers(0, len(member) - 1))
    member[at] ^= data.draw(st.integers(1, 255))
    out, _ = _inflate(bytes(member), "gzip", InflateLimits(1 << 21, 0))
    assert out is None or out == part


@FEW
@given(size=st.integers(1 << 20, 16 << 20), coding=st.sampled_from(["gzip", "deflate"]), limits=_LIMITS)
def test_a_bomb_is_refused_past_the_cap_allocating_no_more_than_it(size, coding, limits):
    bomb = gzip.compress(bytes(size)) if coding == "gzip" else zlib.compress(bytes(size))
    out, peak = _inflate(bomb, coding, limits)
    if size > limits.cap(len(bomb)):
        assert out is None
    else:
        assert out == bytes(size)
    assert peak <= 3 * limits.cap(len(bomb)) + 64 * len(bomb) + 256 * 1024


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("data", [b"", b"\x1f", b"\x1f\x8b", b"\x78\x9c", b"\x00" * 16, b"\xff" * 16])
def test_scraps_are_refused(coding, data):
    out, _ = _inflate(data, coding, InflateLimits(1 << 20))
    assert out is None or out == b""


def test_many_gzip_members_inflate_in_time_linear_in_their_size():
    """Found reviewing multi-member gzip for these tests: 100,000 empty members (2 MB) inflate in about 0.2 s when each
    is read once; the work is stopped (``stop``) after 2 s."""
    data = gzip.compress(b"") * 100_000
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    try:
        with MemoryBudget(1 << 30).account() as account:
            assert inflate(data, "gzip", InflateLimits(1 << 26, 0), account, stop=stop) == b""
    except Exception as exc:  # noqa: BLE001 - the worker's stop
        pytest.fail(f"2 MB of empty gzip members did not inflate within 2 s ({type(exc).__name__})")
    finally:
        timer.cancel()
