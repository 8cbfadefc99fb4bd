"""Checks and decoding every front end applies to a tensor a client sends, whatever its wire format.

A declared shape is checked before anything is sized from it; raw tensor bytes (Triton's binary tensor
extension over HTTP, ``raw_input_contents`` over gRPC) are read in place with ``np.frombuffer``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.core.tensors import decode_bytes_tensor, element_size, numpy_dtype

__all__ = ["BYTES_ELEMENT_OVERHEAD", "MAX_DIMS", "MAX_ELEMENTS", "DecodeLimits", "byte_size_words", "check_shape",
           "datatype_size", "decode_raw_tensor"]

# Largest tensor (in elements) any request may declare; guards the arithmetic, not the memory (the
# request size limit does that).
MAX_ELEMENTS = 2**40
MAX_DIMS = 64
_UINT64 = 1 << 64
_INT = {int}
# What one BYTES element costs beyond its text: a pointer in the object array and a bytes object.
BYTES_ELEMENT_OVERHEAD = 8 + 33


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds checked before anything is allocated (JSON nesting is bounded by the JSON parser)."""

    max_tensor_elements: int = 1 << 30
    max_inputs: int = 256


def datatype_size(datatype: object, name: str) -> int | None:
    """The element size of a v2 datatype this server knows (None for BYTES, sized only once serialized);
    InvalidInput for anything else, input ``name``'s."""
    if not isinstance(datatype, str) or not datatype:
        raise InvalidInput(f"input '{name}' needs a 'datatype' string (e.g. \"FP32\")")
    try:
        return element_size(datatype)
    except ValueError as exc:  # Triton's words, then the datatypes there are
        raise InvalidInput(f"invalid datatype for input {name}; {exc}") from None


def check_shape(raw: object, name: str, limit: int, itemsize: int | None = None) -> tuple[tuple[int, ...], int]:
    """The shape as a tuple and its element count; at most ``MAX_DIMS`` non-negative dimensions and no
    more than ``limit`` (max_tensor_elements) elements, nor non-zero dimensions whose product is more. ``itemsize``: the
    datatype's element size, for Triton's byte-size overflow check."""
    dims = raw if type(raw) is list else (  # a JSON list, or a protobuf's repeated field
        list(raw) if isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) else raw)
    if not isinstance(dims, list) or len(dims) > MAX_DIMS or not set(map(type, dims)) <= _INT:
        raise InvalidInput(
            f"input '{name}': 'shape' must be a list of at most {MAX_DIMS} non-negative integers, got {dims!r}"[:400]
        )
    if dims and min(dims) < 0:
        raise InputMismatch(
            f"input '{name}': 'shape' must be a list of non-negative integers, got {dims!r}"[:400],
            f"All input dimensions should be specified for input '{name}' for model '{{model}}', got "
            f"[{','.join(str(d) for d in dims)}]",
        )
    count, bound = math.prod(dims), limit if limit < MAX_ELEMENTS else MAX_ELEMENTS  # (min() parses keywords)
    if 0 < count <= bound:  # the common shape: within the bound, so no overflow either (2**40 * 16 < 2**64)
        return tuple(dims), count
    if count >= _UINT64:  # Triton's words, then this server's bound
        raise InvalidInput(f"input '{name}': shape {dims} causes total element count to exceed maximum size of "
                           f"{_UINT64 - 1}; at most {bound} elements are allowed (max_tensor_elements)")
    if itemsize and count * itemsize >= _UINT64:
        raise InvalidInput(f"byte size overflow for input '{name}': shape {dims} of {itemsize}-byte elements; at "
                           f"most {bound} elements are allowed (max_tensor_elements)")
    # numpy sizes a shape by its non-zero dimensions: [0, 2**62] or [0, 2**30, 2**30] (FP64) has no elements
    # but is no shape numpy makes, so those count against the bound too.
    if count > bound or (not count and math.prod(d for d in dims if d) > bound):  # (count > 0: no zero dims)
        raise InvalidInput(
            f"input '{name}': shape {dims} has more elements, or non-zero dimensions whose product is larger, than "
            f"the {bound} allowed (max_tensor_elements)"
        )
    return tuple(dims), count


def byte_size_words(name: str, expected: int, got: int) -> str:
    """Triton's words for an input whose bytes do not fit its shape (``{model}`` for the model)."""
    return f"input byte size mismatch for input '{name}' for model '{{model}}'. Expected {expected}, got {got}"


def decode_raw_tensor(chunk: memoryview | bytes, datatype: str, shape: tuple[int, ...], count: int,
                      name: str, size_name: str = "the raw data size") -> np.ndarray:
    """A tensor from its raw bytes (little-endian elements, BYTES as 4-byte-length-prefixed items),
    which must be exactly what the shape needs; fixed-size types are views of ``chunk``. ``size_name``
    says in errors where the size came from (``binary_data_size``, ``raw_input_contents[0]``...)."""
    if datatype == "BYTES":
        return decode_bytes_tensor(chunk, count, name).reshape(shape)
    itemsize = element_size(datatype)
    assert itemsize is not None
    if len(chunk) != count * itemsize:
        raise InputMismatch(
            f"input '{name}': shape {list(shape)} of {datatype} needs {count * itemsize} bytes, "
            f"{size_name} is {len(chunk)}",
            byte_size_words(name, count * itemsize, len(chunk)),
        )
    return np.frombuffer(chunk, dtype=numpy_dtype(datatype)).reshape(shape)
