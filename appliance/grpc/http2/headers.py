"""gRPC's HTTP/2 headers: HPACK decoding of what a client sends and encoding of the few header blocks the
server sends, both by the ``hpack`` package, one decoder and one encoder per connection (HPACK's dynamic
tables are per connection). Each side answers the blocks that come call after call from a cache, kept
while no block changes its dynamic table."""

from __future__ import annotations

import base64
import binascii
from typing import TypeAlias, TypeVar, cast

import hpack

from appliance.core.kept import remember

__all__ = ["ENCODER_TABLE_SIZE", "HeaderDecoder", "HeaderEncoder", "Request", "grpc_timeout"]

_CACHED_BLOCKS = 64
_HIGH = frozenset(range(0x81, 0xFF))
"""The first byte of an indexed field whose index fits in it (1..126): a block of those alone changes no
table (how the server's encoder tells its repeated blocks)."""
ENCODER_TABLE_SIZE = 4096
"""Bytes of dynamic table the server's encoder uses at most (HPACK's default): a client's larger
SETTINGS_HEADER_TABLE_SIZE (up to 4 GiB) never makes the server hold more."""

_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


def _remember(cache: dict[_Key, _Value], key: _Key, value: _Value, unchanged: bool) -> None:
    """Keep ``value`` under ``key`` when the HPACK block it was decoded from or encoded as left the dynamic
    table ``unchanged``: the same key then gives the same value until a block may have changed it. Any
    other block empties the cache: the table may have changed, and indexes may now name other fields."""
    if unchanged:
        remember(cache, key, value, _CACHED_BLOCKS)
    else:
        cache.clear()


def _table_state(table: hpack.table.HeaderTable) -> tuple[int, object, int]:
    """What changes whenever a block changes a dynamic table: every insertion puts a new entry first (an
    eviction, or a clear, also shortens it), a size update changes its bound."""
    entries = table.dynamic_entries
    return len(entries), entries[0] if entries else None, table.maxsize


class HeaderDecoder:
    """One connection's HPACK decoder, handing out each block as a ``Request``. A block that changed no
    table when it was decoded (indexed fields and literals not indexed: how clients send the headers they
    repeat on every call, once they are in the dynamic table) decodes the same way while the table stays
    as it is, so its ``Request`` is cached until a block changes the table; a cached one is shared between
    calls and never changed."""

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, Request] = {}

    def decode(self, block: bytes) -> Request:
        """The block's request; ``hpack.HPACKError`` (a COMPRESSION_ERROR) when it is not HPACK."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table
        before = _table_state(table)
        request = Request(cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True)))
        after = _table_state(table)
        unchanged = after[0] == before[0] and after[1] is before[1] and after[2] == before[2]
        _remember(self._cache, block, request, unchanged)
        return request


_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"))


class Request:
    """A call's headers: the pseudo-headers a server routes by, and the metadata its handler reads.
    ``malformed`` says why the block is not a well-formed HTTP/2 request (RFC 9113 section 8.2 and 8.3),
    ``bad_timeout`` holds a ``grpc-timeout`` that is not gRPC's form; ``trailer`` whether the block can be
    a request's trailers (no pseudo-header)."""

    __slots__ = ("bad_timeout", "content_length", "content_type", "encoding", "malformed", "memo", "metadata",
                 "method", "path", "timeout", "trailer")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.memo: object = None
        """What a handler derives from these headers alone, kept while the connection keeps the block
        cached (``HeaderDecoder``): the same bytes on the same connection name the same caller."""
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


_Field: TypeAlias = tuple[bytes, bytes] | tuple[bytes, bytes, bool]
"""(name, value), or (name, value, True) for a field never indexed."""
_CONTENT_TYPE = (b"content-type", b"application/grpc")
_ACCEPT_ENCODING = (b"grpc-accept-encoding", b"identity,deflate,gzip")
_RESPONSE = ((b":status", b"200"), _CONTENT_TYPE, _ACCEPT_ENCODING)
_STATUSES = tuple((b"grpc-status", str(code).encode()) for code in range(17))
"""grpc-status fields of gRPC's 17 codes, built once (a trailer's cache key is then a tuple of constants)."""


class HeaderEncoder:
    """One connection's HPACK encoder (``hpack.Encoder``) for the blocks the server sends. HPACK state is
    shared by every block of the connection, so each block must be sent, in the order it was encoded, as
    soon as it is (``Call`` and ``Http2Connection`` write it at once). Literal values are not Huffman
    coded: printable ASCII may grow under Huffman coding (a backslash takes 19 bits), and a grpc-message
    must stay within a frame.

    A call's usual blocks (the response headers, ``grpc-status: 0``) are in the dynamic table after the
    first call: hpack then writes one indexed byte a field, and since such a block changes no table it is
    cached until a block that may change the table is encoded (as ``HeaderDecoder`` does), which costs a
    dict lookup instead of hpack's few microseconds a block."""

    __slots__ = ("_cache", "_encoder")

    def __init__(self) -> None:
        self._encoder = hpack.Encoder()
        self._encoder.header_table_size = ENCODER_TABLE_SIZE
        self._cache: dict[tuple[_Field, ...], bytes] = {}

    def resize(self, size: int) -> None:
        """The client's SETTINGS_HEADER_TABLE_SIZE: the table shrinks (at most ``ENCODER_TABLE_SIZE``), and
        the next block says so."""
        size = min(size, ENCODER_TABLE_SIZE)
        if size != self._encoder.header_table_size:
            encoder = self._encoder
            encoder.header_table_size = size
            # hpack signals every change since the last block, in order; the client holds the block to the
            # last SETTINGS it sent, so the block says only the smallest size and then the last (RFC 7541
            # section 4.2: two at most).
            changes = encoder.table_size_changes
            if len(changes) > 1:
                smallest = min(changes)
                encoder.table_size_changes = [smallest] if smallest == size else [smallest, size]
            self._cache.clear()

    def encode(self, fields: tuple[_Field, ...]) -> bytes:
        """The block of ``fields``."""
        block = self._cache.get(fields)
        if block is not None:
            return block
        block = self._encoder.encode(fields, huffman=False)
        _remember(self._cache, fields, block, _HIGH.issuperset(block))  # one-byte indexed fields only
        return block

    def response(self, status: int = 200) -> bytes:
        """The headers that start an answer: a gRPC one, or an HTTP status alone (405, 415) for a request
        that is not gRPC."""
        if status == 200:
            return self.encode(_RESPONSE)
        return self.encode(((b":status", str(status).encode()), _CONTENT_TYPE, _ACCEPT_ENCODING))

    def trailers(self, code: int, message: str, metadata: tuple[tuple[str, str], ...] = (),
                 headers_sent: bool = True) -> bytes:
        """The trailers that end a call with status ``code``; a Trailers-Only response's whole block when no
        headers were sent yet. A grpc-message is never indexed: messages differ call after call, and each
        would push the fields every call reuses out of the table."""
        fields: tuple[_Field, ...] = () if headers_sent else _RESPONSE
        fields += (_STATUSES[code] if 0 <= code < len(_STATUSES) else (b"grpc-status", str(code).encode()),)
        if message:
            fields += ((b"grpc-message", _percent_encoded(message), True),)
        if metadata:
            fields += tuple((key.lower().encode("latin-1"), value.encode("latin-1", "replace"))
                            for key, value in metadata)
        return self.encode(fields)
