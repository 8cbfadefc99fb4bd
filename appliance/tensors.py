"""Tensors as every layer names them: KServe v2 datatypes and their numpy and Triton-config equivalents,
a runtime's description of a tensor, and Triton's binary encoding of BYTES elements.

A leaf: the core, the backends and the front ends import it, and it imports nothing of theirs.

BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``. BF16 tensors are arrays of
``ml_dtypes.bfloat16``: numpy has no bfloat16 of its own, and ml_dtypes' is the one Triton's own client
(tritonclient's ``set_data_from_numpy`` / ``as_numpy`` for BF16), JAX, TensorFlow and onnx use; it is a
dtype of its own (a BF16 tensor cannot be mistaken for UINT16, as 16-bit words tagged BF16 could be once
an operation dropped the tag), two bytes per element laid out as the wire format lays them out (so
binary bodies, raw gRPC contents, shared memory and the Python backend's arenas carry it unchanged),
and ``array.view(np.int16)`` hands the same memory to torch as ``torch.bfloat16``.
"""

from __future__ import annotations

import dataclasses
import struct

import ml_dtypes
import numpy as np

from appliance.errors import InvalidInput

__all__ = [
    "BF16",
    "CONFIG_TO_V2",
    "V2_TO_CONFIG",
    "RuntimeTensor",
    "decode_bytes_tensor",
    "element_size",
    "encode_bytes_tensor",
    "numpy_dtype",
    "v2_datatype",
]


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeTensor:
    """A tensor as a runtime describes it: full shape, ``-1`` for a dimension it leaves open."""

    name: str
    datatype: str
    shape: tuple[int, ...]


# -- datatypes ------------------------------------------------------------------------------------

BF16 = np.dtype(ml_dtypes.bfloat16)
"""The numpy dtype of BF16 tensors."""

_V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
    "BF16": BF16,
}
_NUMPY_TO_V2 = {dt: name for name, dt in _V2_TO_NUMPY.items() if name != "BYTES"}

# Triton config enum names ("TYPE_FP32") <-> v2 names ("FP32"); TYPE_STRING is v2's BYTES.
V2_TO_CONFIG = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in _V2_TO_NUMPY}
CONFIG_TO_V2 = {cfg: v2 for v2, cfg in V2_TO_CONFIG.items()}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a v2 datatype (BF16: ``ml_dtypes.bfloat16``); ValueError for an unknown one."""
    dtype = _V2_TO_NUMPY.get(datatype)
    if dtype is None:
        raise ValueError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(_V2_TO_NUMPY)}"
        )
    return dtype


def v2_datatype(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _NUMPY_TO_V2[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype") from None


def element_size(datatype: str) -> int | None:
    """Bytes per element in the binary encoding, or None for variable-size BYTES."""
    if datatype == "BYTES":
        return None
    return numpy_dtype(datatype).itemsize


# -- BYTES as 4-byte-little-endian-length-prefixed elements (Triton's binary encoding) -------------

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
