"""gRPC's HTTP/2 headers: HPACK decoding of what a client sends (the ``hpack`` package, with the blocks a
client repeats call after call answered from a cache), and the few header blocks the server sends,
encoded as literals that never touch the client's dynamic table."""

from __future__ import annotations

import base64
import binascii
from typing import cast

import hpack

__all__ = ["HeaderDecoder", "RESPONSE_HEADERS", "Request", "grpc_timeout", "response_block", "trailers_block"]

_CACHED_BLOCKS = 64
_HIGH = frozenset(range(0x81, 0xFF))
"""The first byte of an indexed field whose index fits in it (1..126)."""


class HeaderDecoder:
    """One connection's HPACK decoder, handing out each block as a ``Request``. A block made only of
    one-byte indexed fields (how gRPC clients send the headers they repeat on every call, once they are in
    the dynamic table) changes no table, so its ``Request`` is cached until a block that may change the
    table comes; a cached one is shared between calls and never changed."""

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, Request] = {}

    def decode(self, block: bytes) -> Request:
        """The block's request; ``hpack.HPACKError`` (a COMPRESSION_ERROR) when it is not HPACK."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        request = Request(cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True)))
        if _HIGH.issuperset(block):
            if len(self._cache) >= _CACHED_BLOCKS:
                self._cache.clear()
            self._cache[block] = request
        else:
            self._cache.clear()  # the table may have changed: indexes may now name other fields
        return request


_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))


class Request:
    """A call's headers: the pseudo-headers a server routes by, and the metadata its handler reads.
    ``malformed`` says why the block is not a well-formed HTTP/2 request (RFC 9113 section 8.2 and 8.3),
    ``bad_timeout`` holds a ``grpc-timeout`` that is not gRPC's form; ``trailer`` whether the block can be
    a request's trailers (no pseudo-header)."""

    __slots__ = ("bad_timeout", "content_length", "content_type", "encoding", "malformed", "metadata", "method",
                 "path", "timeout", "trailer")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.method = self.path = self.content_type = b""
        self.encoding = b"identity"
        self.timeout: float | None = None
        self.bad_timeout: bytes | None = None
        self.content_length: int | None = None
        self.malformed: str | None = None
        metadata: list[tuple[str, str | bytes]] = []
        pseudo: set[bytes] = set()
        regular = False
        for name, value in fields:
            if name != name.lower():
                self._malform(f"the header name {name!r} has upper-case letters")
            if name[:1] == b":":
                if regular:
                    self._malform(f"the pseudo-header {name!r} follows a regular header")
                if name not in _PSEUDO:
                    self._malform(f"{name!r} is not a request pseudo-header")
                if name in pseudo:
                    self._malform(f"the pseudo-header {name!r} is repeated")
                pseudo.add(name)
                if name == b":path":
                    self.path = value
                elif name == b":method":
                    self.method = value
                continue
            regular = True
            if name == b"content-type":
                self.content_type = value
            elif name == b"grpc-encoding":
                self.encoding = value
            elif name == b"grpc-timeout":
                self.timeout = grpc_timeout(value)
                if self.timeout is None:
                    self.bad_timeout = value
            elif name == b"te":
                if value != b"trailers":
                    self._malform("the te header may only be 'trailers'")
            elif name == b"grpc-accept-encoding":
                pass
            elif name in _CONNECTION_SPECIFIC:
                self._malform(f"the connection-specific header {name!r} is not allowed in HTTP/2")
            else:
                if name == b"content-length":
                    self.content_length = int(value) if value.isdigit() and len(value) < 19 else -1
                    if self.content_length < 0:
                        self._malform("content-length is not a number")
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    try:
                        metadata.append((key, base64.b64decode(value + b"==")))
                    except binascii.Error:
                        continue  # not base64: dropped, as grpc does
                else:
                    metadata.append((key, value.decode("latin-1")))
        self.metadata = tuple(metadata)
        self.trailer = not pseudo
        if pseudo and self.malformed is None:
            if not {b":method", b":scheme", b":path"} <= pseudo:
                self._malform("a request needs :method, :scheme and :path")
            elif not self.path:
                self._malform("the :path is empty")

    def _malform(self, reason: str) -> None:
        if self.malformed is None:
            self.malformed = reason


_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def grpc_timeout(value: bytes) -> float | None:
    """Seconds in a ``grpc-timeout`` header (1 to 8 ASCII digits and a unit, nothing else: gRPC's
    TimeoutValue TimeoutUnit); None when it is malformed."""
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not digits.isascii() or not digits.isdigit() or unit not in _UNITS:
        return None
    return int(digits) * _UNITS[unit]


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A field as a literal without indexing, new name, no Huffman coding (RFC 7541 section 6.2.2)."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def response_block(status: int = 200) -> bytes:
    status_field = b"\x88" if status == 200 else _literal(b":status", str(status).encode())  # static index 8
    return (status_field
            + b"\x0f\x10" + _integer(16, 7) + b"application/grpc"  # content-type (static name index 31)
            + _literal(b"grpc-accept-encoding", b"identity,deflate,gzip"))


RESPONSE_HEADERS = response_block()
_MESSAGE_LIMIT = 8192
"""Bytes of a ``grpc-message`` as sent, percent-encoding included: with the status and the trailing
metadata a server sets, the trailers stay well inside the 16 KiB frame every peer takes."""
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}


def _percent_encoded(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")
    if _PLAIN.issuperset(raw):
        return raw[:_MESSAGE_LIMIT]
    out = bytearray()
    for byte in raw:
        piece = bytes((byte,)) if byte in _PLAIN else b"%%%02X" % byte
        if len(out) + len(piece) > _MESSAGE_LIMIT:
            break  # never half an escape
        out += piece
    return bytes(out)


def trailers_block(code: int, message: str, metadata: tuple[tuple[str, str], ...] = (),
                   headers_sent: bool = True) -> bytes:
    """The trailers that end a call with status ``code``; a Trailers-Only response's whole block when no
    headers were sent yet."""
    block = b"" if headers_sent else RESPONSE_HEADERS
    block += _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", _percent_encoded(message))
    for key, value in metadata:
        block += _literal(key.lower().encode("latin-1"), value.encode("latin-1", "replace"))
    return block
