"""What a client may send an HTTP/2 connection that does no work for it: each kind counted per
connection in a token bucket, and past it the connection ends with GOAWAY(ENHANCE_YOUR_CALM).

HTTP/2 lets a client send frames the server must process but that carry no request: SETTINGS (each one
acknowledged), PING (each one answered), PRIORITY, WINDOW_UPDATE, empty DATA, streams it resets at once
("rapid reset", CVE-2023-44487), streams refused over the concurrency cap, empty header fragments, frames
of unknown types. Each costs the event loop a few microseconds and some cost more (an answer to write), so
a connection sending them without end stalls every other client (the CVE-2019-9511..9518 family). The
buckets below follow nghttp2's token bucket on stream resets (``nghttp2_option_set_stream_reset_rate_limit``)
and cowboy's ``max_received_frame_rate`` and ``max_reset_stream_rate``, one per kind: a burst a
well-behaved client never reaches, refilled at a rate it never sustains. (hypercorn and the ``h2`` library
keep no such counters: a server on them adds its own.)"""

from __future__ import annotations

import dataclasses
import enum

from appliance.grpc.http2.frames import Error, FrameError

__all__ = ["FLOOD_LIMITS", "WINDOW_UPDATE_BUNCH", "Flood", "FloodLimit", "FloodMeter"]


class Flood(enum.StrEnum):
    """(A str too: a dict keyed by one hashes it as its text, in C; a plain Enum's hash is a Python call,
    and a connection counts two a call.)"""

    SETTINGS = "SETTINGS frames"
    PING = "PING frames"
    PRIORITY = "PRIORITY frames"
    WINDOW_UPDATE = "WINDOW_UPDATE frames"
    EMPTY = "empty DATA, HEADERS or CONTINUATION frames"
    RESET = "calls cancelled (RST_STREAM)"
    REFUSED = "streams refused over the concurrency cap"
    UNKNOWN = "frames of unknown types"


@dataclasses.dataclass(frozen=True, slots=True)
class FloodLimit:
    burst: int
    """Frames of this kind a connection may send at once."""
    rate: float
    """Frames a second the allowance refills by."""


FLOOD_LIMITS: dict[Flood, FloodLimit] = {
    # A client acknowledges and sends SETTINGS a few times a connection.
    Flood.SETTINGS: FloodLimit(100, 10.0),
    # Keepalive and BDP pings: grpc-core's clients send a handful a second at most.
    Flood.PING: FloodLimit(200, 20.0),
    Flood.PRIORITY: FloodLimit(1000, 100.0),
    # One per DATA frame a client reads at most: generous, as large answers take many.
    Flood.WINDOW_UPDATE: FloodLimit(20_000, 10_000.0),
    Flood.EMPTY: FloodLimit(1000, 100.0),
    Flood.RESET: FloodLimit(1000, 100.0),
    Flood.REFUSED: FloodLimit(1000, 100.0),
    Flood.UNKNOWN: FloodLimit(1000, 100.0),
}


WINDOW_UPDATE_BUNCH = 16
"""WINDOW_UPDATE frames counted together: a client sends one or two with every answer it reads, and a
bunch of 16 against an allowance of 20,000 changes when a flood is cut off by less than a thousandth."""


class FloodMeter:
    """One connection's buckets; ``count`` raises ``FrameError(ENHANCE_YOUR_CALM)`` past a limit."""

    __slots__ = ("_buckets",)

    def __init__(self, now: float, limits: dict[Flood, FloodLimit] = FLOOD_LIMITS) -> None:
        self._buckets = {kind: _Bucket(limit, now) for kind, limit in limits.items()}

    def count(self, kind: Flood, now: float, frames: int = 1) -> None:
        """``frames`` more frames of ``kind`` (a kind a client sends with every call is counted in bunches:
        see ``WINDOW_UPDATE_BUNCH``)."""
        bucket = self._buckets[kind]
        left = min(bucket.burst, bucket.left + (now - bucket.at) * bucket.rate) - frames
        bucket.at = now
        bucket.left = left
        if left < 0:
            raise FrameError(Error.ENHANCE_YOUR_CALM, f"more than {int(bucket.burst)} {kind.value} at a rate "
                                                      f"above {bucket.rate:g} a second")


class _Bucket:
    """One kind's allowance: frames left (refilled at ``rate`` a second up to ``burst``), as of ``at``."""

    __slots__ = ("at", "burst", "left", "rate")

    def __init__(self, limit: FloodLimit, now: float) -> None:
        self.burst = float(limit.burst)
        self.rate = limit.rate
        self.left = self.burst
        self.at = now
