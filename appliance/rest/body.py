"""The one request-body reader: chunk by chunk, bounded in size, time and memory, decompressed here.

- Size: ``Content-Length`` is checked first when sent, then the bytes that actually arrive (chunked
  bodies too), then the decompressed bytes: each against ``max_request_bytes`` (413).
- Time: every read waits at most ``body_timeout`` for the next bytes (nginx's client_body_timeout);
  a stalled body gets 408 and its connection is closed.
- Memory: every byte held (received, joined, decompressed) is reserved on the request's ``Account`` of
  the global budget before or as it is held (503 past the budget).
- Content-Encoding: aiohttp's own decompression is off (it inflates without a bound, on the event
  loop); gzip and deflate are inflated here with ``zlib.decompressobj`` and ``max_length``, so no more
  than the limit is ever produced, on a worker thread unless the compressed body is tiny. Junk
  compressed data is a 400, any other coding a 415 that names the accepted ones.
- Signed requests (appliance.fleet_signature): the body, as sent, must have the digest signed (401).
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib

from aiohttp import web

from appliance.budget import Account
from appliance.errors import InvalidInput, PayloadTooLarge, RequestTimeout, UnsupportedEncoding
from appliance.fleet_signature import FleetVerifier
from appliance.rest.config import BodyLimits

__all__ = ["ACCEPTED_ENCODINGS", "SIGNED_BODY", "BodyLimits", "body_timeout", "decompress", "read_body", "too_large"]

SIGNED_BODY = "appliance.signed_body"
"""Request key: the SHA-256 (hex) a signed request's body must have, as sent (set by the admission
middleware once the signature is verified; checked here, as the body is read)."""

ACCEPTED_ENCODINGS = ("gzip", "deflate", "identity")

# Compressed bodies up to this size inflate on the event loop: at deflate's ~1000:1 worst case, at most
# a few MiB and milliseconds of work; anything larger goes to a worker thread.
_INLINE_COMPRESSED_BYTES = 4096
# Output produced (and reserved) per decompress call.
_INFLATE_STEP = 1 << 20


def body_timeout(timeout: float, received: int) -> RequestTimeout:
    return RequestTimeout(
        f"no part of the request body arrived for {timeout:g} s (after {received} bytes); send the "
        "body without pauses (the server's body_timeout setting)"
    )


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body is larger than the {limit}-byte limit; send a smaller batch or raise the "
        "server's max_request_bytes setting (APPLIANCE_MAX_REQUEST_BYTES)"
    )


async def read_body(request: web.BaseRequest, account: Account, limits: BodyLimits) -> bytes:
    """The whole body, decompressed; everything it holds stays reserved on ``account``."""
    coding = _content_coding(request.headers.get("Content-Encoding", ""))
    if request.content_length is not None and request.content_length > limits.max_bytes:
        raise too_large(limits.max_bytes)
    chunks: list[bytes] = []
    received = 0
    signed: str | None = request.get(SIGNED_BODY)
    digest = hashlib.sha256() if signed is not None else None
    while chunk := await _next_chunk(request, limits.read_timeout, received):
        received += len(chunk)
        if received > limits.max_bytes:
            raise too_large(limits.max_bytes)
        account.reserve(len(chunk))
        chunks.append(chunk)
        if digest is not None:
            digest.update(chunk)
    if signed is not None and digest is not None:
        FleetVerifier.check_body(signed, digest.hexdigest())
    body = _join(chunks, account)
    if coding == "identity":
        return body
    if len(body) <= _INLINE_COMPRESSED_BYTES:
        inflated = decompress(body, coding, limits.max_bytes, account)
    else:
        inflated = await asyncio.to_thread(decompress, body, coding, limits.max_bytes, account)
    account.release(len(body))  # the compressed copy is dropped when this returns
    return inflated


async def _next_chunk(request: web.BaseRequest, timeout: float, received: int) -> bytes:
    content = request.content
    try:
        chunk = content.read_nowait()  # what has arrived already (a small body: all of it), no timer
        if chunk or content.at_eof():
            return chunk
        async with asyncio.timeout(timeout):
            return await content.readany()
    except TimeoutError:
        raise body_timeout(timeout, received) from None
    except web.RequestPayloadError as exc:
        raise InvalidInput(f"the request body is malformed: {exc}") from None


def _content_coding(header: str) -> str:
    if not header:
        return "identity"
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return "identity"
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return "deflate" if codings[0] == "deflate" else "gzip"
    raise UnsupportedEncoding(
        f"Content-Encoding {header!r} is not supported; send the body uncompressed or with one of "
        "gzip or deflate",
        ACCEPTED_ENCODINGS,
    )


def _join(pieces: list[bytes], account: Account) -> bytes:
    """One bytes object; the pieces and the joined copy coexist for a moment, and are counted so."""
    if len(pieces) == 1:
        return pieces.pop()  # bytes.join would return this very object
    total = sum(map(len, pieces))
    account.reserve(total)
    joined = b"".join(pieces)
    pieces.clear()
    account.release(total)
    return joined


def decompress(data: bytes, coding: str, limit: int, account: Account) -> bytes:
    """Inflate a gzip (any number of members) or deflate (zlib-wrapped or raw) body, never producing
    more than ``limit`` bytes; the output is reserved on ``account`` as it is produced."""
    decoder = _decoder(coding, data)
    pieces: list[bytes] = []
    produced = 0
    pending = data
    while True:
        step = min(_INFLATE_STEP, limit + 1 - produced)
        account.reserve(step)
        try:
            piece = decoder.decompress(pending, step)
        except zlib.error as exc:
            raise InvalidInput(
                f"the request body is not valid {coding} data ({exc}); compress it with {coding} or send "
                "it uncompressed without Content-Encoding"
            ) from None
        account.release(step - len(piece))
        produced += len(piece)
        if produced > limit:
            raise PayloadTooLarge(
                f"the request body inflates to more than the {limit}-byte limit; send a smaller batch or "
                "raise the server's max_request_bytes setting (it bounds decompressed bodies too)"
            )
        if piece:
            pieces.append(piece)
        consumed = len(pending) - len(decoder.unconsumed_tail)
        pending = decoder.unconsumed_tail
        if decoder.eof:
            if not decoder.unused_data:
                return _join(pieces, account)
            if coding != "gzip":
                raise InvalidInput(f"the {coding} request body has data after its end")
            decoder, pending = _decoder(coding, decoder.unused_data), decoder.unused_data  # next member
        elif not piece and not consumed:
            raise InvalidInput(f"the {coding} request body is truncated; send the complete compressed body")


def _decoder(coding: str, data: bytes):
    if coding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    # RFC 9110's deflate is zlib-wrapped; some clients send raw deflate: a zlib header tells them apart.
    wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
