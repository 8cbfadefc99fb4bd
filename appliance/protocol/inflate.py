"""The one inflater of compressed requests, REST bodies (``Content-Encoding``) and gRPC messages
(``grpc-encoding``) alike: gzip (any number of members) and deflate (zlib-wrapped or raw).

A compressed request promises bytes its client never sent (764 KiB of gzip inflate to 768 MiB of zeros),
so nothing here trusts the promise:

- Size: never more than ``max_bytes`` (max_request_bytes) is produced; past it ``PayloadTooLarge``.
- Ratio: never more than ``max_ratio`` times the compressed size (max_inflation_ratio), though anything
  may inflate to ``RATIO_FLOOR``; past it ``PayloadTooLarge``. Tensors and JSON compress 1.1 to a few
  tens of times, bombs sit at deflate's limit (about 1030 times): 200 is Apache httpd's
  ``DeflateInflateRatioLimit``.
- Memory: the output comes in steps of at most ``STEP`` bytes, each reserved on the request's ``Account``
  (after its admission) before it is allocated, so a bomb competes for max_request_memory_bytes as any
  request does (503 or UNAVAILABLE past it) and holds nothing the budget does not count.
- Time: on a worker thread (zlib lets go of the GIL) unless the most it may produce is ``INLINE_BYTES``
  (about a millisecond of work); a caller cancelled meanwhile stops the worker at its next step and waits
  for it, so nothing is reserved on an account its request has let go of.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import zlib

from appliance.core.errors import InvalidInput, PayloadTooLarge
from appliance.security.budget import Account

__all__ = ["CODINGS", "DEFAULT_RATIO", "Compressed", "InflateLimits", "inflate", "inflate_off_loop"]

CODINGS = ("gzip", "deflate")
DEFAULT_RATIO = 200
"""max_inflation_ratio's default (Apache httpd's DeflateInflateRatioLimit)."""
RATIO_FLOOR = 1 << 20
"""What any compressed request may inflate to, whatever its ratio: a small all-zero tensor is no bomb."""
STEP = 1 << 20
"""Bytes produced (and reserved first) at most per step."""
INPUT_STEP = 64 * 1024
"""Compressed bytes handed to zlib at most per step."""
INLINE_BYTES = 1 << 20
"""Requests that may inflate to at most this many bytes are inflated on the calling thread (the event
loop): a worker thread would cost more than the work."""


@dataclasses.dataclass(frozen=True, slots=True)
class InflateLimits:
    max_bytes: int
    """The most any request may inflate to (max_request_bytes)."""
    max_ratio: int = DEFAULT_RATIO
    """The most a request may inflate to as a multiple of its compressed size (max_inflation_ratio); 0: no
    ratio, ``max_bytes`` alone."""

    def cap(self, compressed: int) -> int:
        """The most ``compressed`` bytes may inflate to."""
        if not self.max_ratio:
            return self.max_bytes
        return min(self.max_bytes, max(RATIO_FLOOR, self.max_ratio * compressed))


class Compressed(bytes):
    """Bytes as the client sent them, compressed with ``coding`` (gzip or deflate): what a gRPC transport
    hands over for a message with its compressed flag set; ``inflate`` them on the request's account."""

    coding: str

    def __new__(cls, data: bytes | memoryview, coding: str) -> Compressed:
        made = super().__new__(cls, data)
        made.coding = coding
        return made


class _Stopped(Exception):
    """The caller went away: the worker stops."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Words:
    what: str
    header: str


def inflate(data: bytes, coding: str, limits: InflateLimits, account: Account, *, what: str = "request body",
            header: str = "Content-Encoding", stop: threading.Event | None = None) -> bytes:
    """``data`` inflated, every byte of the result reserved on ``account`` before it was allocated (and
    nothing left reserved when it raises). ``what`` and ``header`` name the request and where its coding
    came from, for the refusals; ``stop``, once set, ends the work at the next step."""
    words = _Words(what, header)
    cap = limits.cap(len(data))
    view = memoryview(data)
    decoder = _decoder(coding, data)
    pieces: list[bytes] = []
    produced = reserved = position = 0
    try:
        while True:
            if stop is not None and stop.is_set():
                raise _Stopped()
            step = min(STEP, cap + 1 - produced)  # one byte past the cap tells that it was passed
            account.reserve(step)
            reserved += step
            # A bounded slice of the input: zlib copies what it leaves (unconsumed_tail, unused_data), and a
            # copy of all the rest at every step (or every gzip member) would cost quadratic time.
            chunk = view[position:position + INPUT_STEP]
            try:
                piece = decoder.decompress(chunk, step)
            except zlib.error as exc:
                raise InvalidInput(f"the {what} is not valid {coding} data ({exc}); compress it with {coding} or "
                                   f"send it uncompressed without {header}") from None
            account.release(step - len(piece))
            reserved -= step - len(piece)
            produced += len(piece)
            if produced > cap:
                raise _too_large(words, limits, len(data), cap)
            if piece:
                pieces.append(piece)
            consumed = len(chunk) - len(decoder.unconsumed_tail) - len(decoder.unused_data)
            position += consumed
            if decoder.eof:
                if position == len(data):
                    return account.join(pieces)
                if coding != "gzip":
                    raise InvalidInput(f"the {coding} {what} has data after its end")
                decoder = _decoder(coding, data)  # the next gzip member
            elif not piece and not consumed:
                raise InvalidInput(f"the {coding} {what} is truncated; send the complete compressed {what}")
    except BaseException:
        pieces.clear()
        account.release(reserved)
        raise


async def inflate_off_loop(data: bytes, coding: str, limits: InflateLimits, account: Account, *,
                           what: str = "request body", header: str = "Content-Encoding") -> bytes:
    """``inflate`` on a worker thread, unless ``data`` cannot inflate past ``INLINE_BYTES``."""
    if limits.cap(len(data)) <= INLINE_BYTES:
        return inflate(data, coding, limits, account, what=what, header=header)
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(inflate, data, coding, limits, account, what=what, header=header,
                                                   stop=stop))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        # The request ends (and gives back its account) only once the worker no longer reserves on it.
        stop.set()
        await asyncio.wait((work,))
        if not work.cancelled():
            work.exception()  # retrieved: the worker's _Stopped (or a refusal) is no one's news now
        raise


def _too_large(words: _Words, limits: InflateLimits, compressed: int, cap: int) -> PayloadTooLarge:
    if cap < limits.max_bytes:
        return PayloadTooLarge(
            f"the {words.what} inflates to more than {limits.max_ratio} times its {compressed} compressed bytes: "
            f"refused as a compression bomb (the max_inflation_ratio setting); send it uncompressed, or raise "
            "max_inflation_ratio (0 turns the ratio off)")
    return PayloadTooLarge(
        f"the {words.what} inflates to more than the {limits.max_bytes}-byte limit; send a smaller batch or raise "
        "the server's max_request_bytes setting (it bounds decompressed requests too)")


def _decoder(coding: str, data: bytes):
    if coding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    # RFC 9110's deflate (and gRPC's) is zlib-wrapped; some clients send raw deflate: a zlib header tells them
    # apart.
    wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
