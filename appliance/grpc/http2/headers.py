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


class Request:
    """A call's headers: the pseudo-headers a server routes by, and the metadata its handler reads."""

    __slots__ = ("content_type", "encoding", "metadata", "method", "path", "timeout")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.method = self.path = self.content_type = b""
        self.encoding = b"identity"
        self.timeout: float | None = None
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in fields:
            if name[:1] == b":":
                if name == b":path":
                    self.path = value
                elif name == b":method":
                    self.method = value
                continue
            if name == b"content-type":
                self.content_type = value
            elif name == b"grpc-encoding":
                self.encoding = value
            elif name == b"grpc-timeout":
                self.timeout = grpc_timeout(value)
            elif name in (b"te", b"grpc-accept-encoding"):
                pass
            else:
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    try:
                        metadata.append((key, base64.b64decode(value + b"==")))
                    except binascii.Error:
                        continue  # not base64: dropped, as grpc does
                else:
                    metadata.append((key, value.decode("latin-1")))
        self.metadata = tuple(metadata)


_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def grpc_timeout(value: bytes) -> float | None:
    """Seconds in a ``grpc-timeout`` header (at most 8 digits and a unit); None when it is malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _UNITS:
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
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}


def _percent_encoded(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")[:_MESSAGE_LIMIT]
    if _PLAIN.issuperset(raw):
        return raw
    return b"".join(bytes((byte,)) if byte in _PLAIN else b"%%%02X" % byte for byte in raw)


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
