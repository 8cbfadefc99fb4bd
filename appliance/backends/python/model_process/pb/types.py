"""Triton's data types as model.py files see them: config strings, numeric codes and numpy dtypes."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "deserialize_bytes_tensor",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes (1 = BOOL ... 13 = BYTES, 14 = BF16), as Tensor.triton_dtype() returns them.
_CODES: list[tuple[int, Any]] = [
    (1, np.bool_), (2, np.uint8), (3, np.uint16), (4, np.uint32), (5, np.uint64), (6, np.int8),
    (7, np.int16), (8, np.int32), (9, np.int64), (10, np.float16), (11, np.float32), (12, np.float64),
    (13, np.object_),
]
BF16_CODE = 14


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType code (None for codes numpy has no type for)."""
    return next((dtype for code, dtype in _CODES if code == data_type), None)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType code of a numpy type (None when Triton has none)."""
    if data_type == np.object_ or data_type == np.bytes_:
        return 13
    return next((code for code, dtype in _CODES if code != 13 and data_type == dtype), None)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple | None:
    """Length-prefixed (4 bytes, little endian) elements in C order, as Triton's BYTES wire format."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The 1-D object array of ``bytes`` that a length-prefixed buffer holds."""
    items = []
    offset = 0
    view = memoryview(encoded_tensor)
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)
