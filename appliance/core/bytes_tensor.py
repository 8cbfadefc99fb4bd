"""BYTES tensors as 4-byte-little-endian-length-prefixed elements (Triton's binary encoding)."""

from __future__ import annotations

import struct

import numpy as np

from appliance.errors import InvalidInput

__all__ = ["decode_bytes_tensor", "encode_bytes_tensor"]

_U32 = struct.Struct("<I")


def decode_bytes_tensor(buffer: memoryview | bytes, count: int, name: str) -> np.ndarray:
    """Parse ``count`` 4-byte-length-prefixed elements; the buffer must hold exactly those."""
    view = memoryview(buffer)
    offset, end = 0, len(view)
    if count * 4 > end:  # checked before anything is sized by the claimed count
        raise InvalidInput(
            f"input '{name}': {count} BYTES elements need at least {count * 4} bytes of length prefixes, "
            f"but the binary data has {end}"
        )
    items = np.empty(count, dtype=object)
    for index in range(count):
        if offset + 4 > end:
            raise InvalidInput(
                f"input '{name}': binary BYTES data ends after {index} of {count} elements"
            )
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise InvalidInput(
                f"input '{name}': BYTES element {index} claims {length} bytes, "
                f"but only {end - offset} remain"
            )
        items[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise InvalidInput(
            f"input '{name}': {end - offset} bytes left over after {count} BYTES elements"
        )
    return items


def encode_bytes_tensor(array: np.ndarray) -> bytes:
    parts = []
    for item in array.ravel():
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)
