"""HTTP/2 framing (RFC 9113): the frame header, the frame types and flags, SETTINGS, error codes."""

from __future__ import annotations

import struct

__all__ = ["ACK", "CONTINUATION", "DATA", "END_HEADERS", "END_STREAM", "GOAWAY", "HEADERS", "PADDED", "PING",
           "PREFACE", "PRIORITY", "PRIORITY_FLAG", "PUSH_PROMISE", "RST_STREAM", "SETTINGS", "WINDOW_UPDATE",
           "Error", "FrameError", "frame", "goaway", "parse_settings", "rst_stream", "settings", "unpadded",
           "window_update"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEAD = struct.Struct(">IBI")
"""length (24 bits) and type (8 bits) in one word, flags, stream id (31 bits)."""
WORD = struct.Struct(">I")
"""A 32-bit field (a WINDOW_UPDATE's payload: a reserved bit and the increment)."""

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1


class Error:
    """HTTP/2 error codes (RFC 9113 section 7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


class FrameError(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(``code``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in values.items()))


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise FrameError(Error.FRAME_SIZE_ERROR, "a SETTINGS frame's length is not a multiple of 6")
    values = dict(struct.iter_unpack(">HI", payload))
    if values.get(ENABLE_PUSH, 0) > 1:
        raise FrameError(Error.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH is neither 0 nor 1")
    if values.get(INITIAL_WINDOW_SIZE, 0) > MAX_WINDOW:
        raise FrameError(Error.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
    if MAX_FRAME_SIZE in values and not DEFAULT_FRAME_SIZE <= values[MAX_FRAME_SIZE] <= 2**24 - 1:
        raise FrameError(Error.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
    return values


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


def unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise FrameError(Error.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - payload[0]]
