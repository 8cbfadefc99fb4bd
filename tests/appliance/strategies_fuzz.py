"""Hypothesis strategies and checks shared by the fuzz tests (``tests/**/test_*_fuzz.py``).

Valid tensors of every KServe v2 datatype, byte-level mutations of a valid encoding, JSON values for
the fields a client controls, and the two properties every parser of network bytes must keep: it
refuses with the protocol's own error (an ``ApplianceError`` answered 4xx), and it allocates no more
than a small multiple of the bytes it received (measured with ``tracemalloc``, or counted through the
``reserve`` callback the decoders call before they allocate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tracemalloc
from collections.abc import Iterator

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.core.errors import ApplianceError, InputMismatch, InvalidInput

__all__ = [
    "DATATYPES",
    "FEW",
    "FIXED_DATATYPES",
    "FUZZ",
    "HUGE_COUNTS",
    "Reservations",
    "assert_client_error",
    "assert_same_array",
    "bf16_arrays",
    "json_values",
    "measure_peak",
    "mutated",
    "tensors",
]

_NUMPY = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
FIXED_DATATYPES = (*_NUMPY, "BF16")
DATATYPES = (*FIXED_DATATYPES, "BYTES")

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
"""The codec fuzz tests' settings: the same 200 examples every run, no per-example deadline."""
FEW = settings(FUZZ, max_examples=100)
"""For the properties whose examples cost more (a server round trip, a large encoding)."""

# Element counts a hostile shape claims: past every limit, at them, and around 2**32 and 2**64.
HUGE_COUNTS = (2**20 + 1, 2**30, 2**30 + 1, 2**31, 2**32, 2**40, 2**40 + 1, 2**62, 2**63, 2**64 - 1, 2**64)


def _shapes(max_dims: int, max_side: int) -> st.SearchStrategy[tuple[int, ...]]:
    return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side)


def bf16_arrays(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    """Any 16-bit patterns (NaNs and infinities included) as BF16."""
    return hnp.arrays(np.uint16, shape).map(lambda a: a.view(ml_dtypes.bfloat16))


@st.composite
def tensors(draw: st.DrawFn, datatypes: tuple[str, ...] = DATATYPES, *, finite: bool = False, utf8: bool = False,
            max_dims: int = 3, max_side: int = 4) -> tuple[str, np.ndarray]:
    """A datatype and a random tensor of it (BYTES: an object array of ``bytes``). ``finite``: no NaN or
    infinity (JSON has none); ``utf8``: BYTES elements that are valid UTF-8 (JSON strings)."""
    datatype = draw(st.sampled_from(datatypes))
    shape = draw(_shapes(max_dims, max_side))
    if datatype == "BF16":
        return datatype, draw(bf16_arrays(shape))
    if datatype == "BYTES":
        items = st.text(max_size=12).map(str.encode) if utf8 else st.binary(max_size=12)
        flat = draw(st.lists(items, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return datatype, array.reshape(shape)
    dtype = _NUMPY[datatype]
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=not finite, allow_infinity=not finite)
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements))


def assert_same_array(got: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype, shape and elements (bit for bit for numbers: NaN payloads and -0.0 included)."""
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if expected.dtype == object:
        assert [bytes(x) for x in got.ravel()] == [bytes(x) for x in expected.ravel()]
    else:
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_client_error(exc: BaseException) -> None:
    """A refusal in the protocol's own terms: an ApplianceError a client is blamed for (4xx); a mismatch
    found before the model was known becomes, once the data plane names the model, Triton's words."""
    assert isinstance(exc, ApplianceError), f"{type(exc).__name__} escaped: {exc!r}"
    assert 400 <= exc.status < 500, f"{type(exc).__name__} answers {exc.status}: {exc}"
    if isinstance(exc, InputMismatch):
        finished = exc.finish("m")
        assert isinstance(finished, InvalidInput) and "{model}" not in finished.message


_INTERESTING_U32 = (0, 1, 3, 4, 5, 0x7F, 0xFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF)


@st.composite
def mutated(draw: st.DrawFn, data: bytes, max_ops: int = 3) -> bytes:
    """``data`` after one to ``max_ops`` mutations: truncated, a byte flipped, bytes inserted, a slice
    deleted or duplicated, or four bytes overwritten with a length-like number (little or big endian)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        at = draw(st.integers(0, len(out)))
        op = draw(st.sampled_from(("truncate", "flip", "insert", "delete", "duplicate", "u32")))
        if op == "truncate":
            del out[at:]
        elif op == "flip" and at < len(out):
            out[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del out[at:at + draw(st.integers(1, 8))]
        elif op == "duplicate":
            out[at:at] = out[at:at + draw(st.integers(1, 16))]
        elif op == "u32":
            value = draw(st.sampled_from(_INTERESTING_U32) | st.integers(0, 2**32 - 1))
            out[at:at + 4] = value.to_bytes(4, draw(st.sampled_from(("little", "big"))))
    return bytes(out)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[object]:
    """Any JSON value (as orjson parses it: integers within 64 bits, finite floats)."""
    leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
              | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
    return st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=max_leaves)


@dataclasses.dataclass
class Reservations:
    """A ``reserve`` callback that records what a decoder says it will allocate."""

    calls: list[int] = dataclasses.field(default_factory=list)

    def __call__(self, size: int) -> None:
        assert isinstance(size, int) and size >= 0, size
        self.calls.append(size)

    @property
    def total(self) -> int:
        return sum(self.calls)


@contextlib.contextmanager
def measure_peak() -> Iterator[list[int]]:
    """The peak of memory allocated inside the block (bytes), in the one-item list it yields once the
    block ends, whether it raised or not."""
    result = [0]
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield result
    finally:
        result[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
