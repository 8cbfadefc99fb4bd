"""The one request-body reader: chunk by chunk, bounded in size, time and memory, decompressed here.

- Size: ``Content-Length`` is checked first when sent, then the bytes that actually arrive (chunked
  bodies too), then the decompressed bytes: each against ``max_request_bytes`` (413).
- Time: every read waits at most ``body_timeout`` for the next bytes (nginx's client_body_timeout);
  a stalled body gets 408 and its connection is closed.
- Memory: every byte held (received, joined, decompressed) is reserved on the request's ``Account`` of
  the global budget before or as it is held (503 past the budget).
- Content-Encoding: aiohttp's own decompression is off (it inflates without a bound, on the event loop);
  gzip and deflate are inflated by ``appliance.protocol.inflate`` (the gRPC port's inflater too): within
  max_request_bytes and max_inflation_ratio, each step reserved on the account first, on a worker thread
  unless the body cannot inflate past 1 MiB. Junk compressed data is a 400, any other coding a 415 that
  names the accepted ones.
- Signed requests (appliance.security.fleet_signature): the body, as sent, must have the digest signed (401).
"""

from __future__ import annotations

import asyncio
import hashlib

from aiohttp import web

from appliance.core.errors import InvalidInput, UnsupportedEncoding
from appliance.protocol.inflate import InflateLimits, inflate_off_loop
from appliance.rest.http_basics import body_timeout, too_large
from appliance.rest.rest_config import BodyLimits
from appliance.security.budget import Account
from appliance.security.fleet_signature import FleetVerifier

__all__ = ["ACCEPTED_ENCODINGS", "SIGNED_BODY", "BodyLimits", "read_body"]

SIGNED_BODY = web.RequestKey("appliance.signed_body", str)
"""Request key: the SHA-256 (hex) a signed request's body must have, as sent (set by the admission
middleware once the signature is verified; checked here, as the body is read, and then taken off the
request: the middleware checks a body no handler read before the answer leaves)."""

ACCEPTED_ENCODINGS = ("gzip", "deflate", "identity")


async def read_body(request: web.BaseRequest, account: Account, limits: BodyLimits) -> bytes:
    """The whole body, decompressed; everything it holds stays reserved on ``account``."""
    coding = _content_coding(request.headers.get("Content-Encoding", ""))
    if request.content_length is not None and request.content_length > limits.max_bytes:
        raise too_large(limits.max_bytes, request.content_length)
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
        del request[SIGNED_BODY]  # checked
    body = account.join(chunks)
    if coding == "identity":
        return body
    inflated = await inflate_off_loop(body, coding, InflateLimits(limits.max_bytes, limits.max_inflation_ratio),
                                      account)
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
