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
import functools
import struct

import numpy as np

from appliance.core.errors import InputMismatch

__all__ = [
    "bf16",
    "CONFIG_TO_V2",
    "V2_TO_CONFIG",
    "RuntimeTensor",
    "is_bf16",
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

@functools.cache
def bf16() -> np.dtype:
    """The numpy dtype of BF16 tensors, ``ml_dtypes.bfloat16``, imported on first use: a process that
    never meets a BF16 tensor (most model processes) does not load it (2 MiB each). Where ml_dtypes is
    missing (a Python model's own environment, EXECUTION_ENV_PATH, as in Triton) BF16 tensors arrive as
    their raw 2-byte elements."""
    try:
        import ml_dtypes
    except ImportError:
        return np.dtype((np.void, 2))
    return np.dtype(ml_dtypes.bfloat16)


def is_bf16(dtype: np.dtype) -> bool:
    """Whether arrays of ``dtype`` hold BF16 tensors (without importing ml_dtypes for other dtypes). The kind
    is asked first: ``dtype.name`` costs ~2 µs (numpy builds it in Python), and every BF16 dtype, ml_dtypes'
    or the raw 2-byte void, is of kind "V"."""
    return dtype.kind == "V" and dtype.itemsize == 2 and (dtype.name == "bfloat16" or dtype == bf16())


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
}
"""Every v2 datatype's numpy dtype but BF16's (``bf16()``, loaded on first use)."""
_NUMPY_TO_V2 = {dt: name for name, dt in _V2_TO_NUMPY.items() if name != "BYTES"}
_DATATYPES = (*_V2_TO_NUMPY, "BF16")
_ELEMENT_SIZES: dict[str, int | None] = {name: None if name == "BYTES" else dt.itemsize
                                         for name, dt in _V2_TO_NUMPY.items()} | {"BF16": 2}

# Triton config enum names ("TYPE_FP32") <-> v2 names ("FP32"); TYPE_STRING is v2's BYTES.
V2_TO_CONFIG = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in _DATATYPES}
CONFIG_TO_V2 = {cfg: v2 for v2, cfg in V2_TO_CONFIG.items()}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a v2 datatype (BF16: ``ml_dtypes.bfloat16``); ValueError for an unknown one."""
    dtype = _V2_TO_NUMPY.get(datatype)
    if dtype is None:
        if datatype == "BF16":
            return bf16()
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(_DATATYPES)}")
    return dtype


def v2_datatype(dtype: np.dtype) -> str:
    if isinstance(dtype, np.dtype):  # a numeric numpy dtype (the common case) is a key as it is
        name = _NUMPY_TO_V2.get(dtype)
        if name is not None:
            return name
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    name = _NUMPY_TO_V2.get(dtype)
    if name is not None:
        return name
    if is_bf16(dtype):
        return "BF16"
    raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype")


def element_size(datatype: str) -> int | None:
    """Bytes per element in the binary encoding, or None for variable-size BYTES; ValueError for an unknown
    datatype (a table: asked for every input of every request)."""
    try:
        return _ELEMENT_SIZES[datatype]
    except (KeyError, TypeError):
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(_DATATYPES)}") from None


# -- BYTES as 4-byte-little-endian-length-prefixed elements (Triton's binary encoding) -------------

_U32 = struct.Struct("<I")


def decode_bytes_tensor(buffer: memoryview | bytes, count: int, name: str) -> np.ndarray:
    """Parse ``count`` 4-byte-length-prefixed elements; the buffer must hold exactly those.

    Elements are counted as Triton counts them (an element whose length runs past the end counts, and
    ends the data), so that a wrong count is reported in its words; nothing is sized by ``count`` before
    the elements are there (each takes at least 4 bytes). A truncated element is refused even where the
    count is right."""
    view = memoryview(buffer)
    offset, end = 0, len(view)
    items: list[bytes] = []
    truncated = ""
    while offset < end:
        if len(items) == count:
            raise InputMismatch(
                f"input '{name}': {end - offset} bytes left over after {count} BYTES elements",
                f"unexpected number of string elements {count + 1} for inference input '{name}' for model "
                f"'{{model}}', expecting {count}",
            )
        if end - offset < 4:
            truncated = f"the binary data ends inside the length prefix of BYTES element {len(items)}"
            break
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            truncated = f"BYTES element {len(items)} claims {length} bytes, but only {end - offset} remain"
            items.append(b"")
            break
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise InputMismatch(
            f"input '{name}': the binary data holds {len(items)} BYTES elements, the shape needs {count} (each a "
            "4-byte little-endian length, then that many bytes)",
            f"expected {count} string elements for inference input '{name}' for model '{{model}}', got "
            f"{len(items)}",
        )
    if truncated:
        raise InputMismatch(f"input '{name}': {truncated}", f"input '{name}' for model '{{model}}': {truncated}")
    decoded = np.empty(count, dtype=object)
    decoded[:] = items
    return decoded


def encode_bytes_tensor(array: np.ndarray) -> bytes:
    parts = []
    for item in array.ravel():
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)
