"""Property-based fuzzing of the tensor checks and decoding both transports share: a declared shape and
datatype (``appliance.engine.tensor_checks``), raw little-endian tensor bytes, BYTES tensors' 4-byte
length prefixes (``appliance.core.tensors``), and Triton's shared-memory parameters of a tensor
(``appliance.protocol.shared_memory.params``).

Properties: whatever a client declares or sends, the answer is a value or the protocol's own 400
(``InvalidInput`` / ``InputMismatch``); a shape is checked before anything is sized from it (2**64
elements cost nothing); BYTES decoding allocates by the bytes received, never by the element count
claimed; and valid tensors round trip, against tritonclient's own BYTES encoder.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.core.tensors import decode_bytes_tensor, element_size, encode_bytes_tensor, numpy_dtype
from appliance.engine.tensor_checks import MAX_DIMS, MAX_ELEMENTS, check_shape, datatype_size, decode_raw_tensor
from appliance.protocol.shared_memory.params import shared_memory_ref
from tests.appliance.strategies_fuzz import (
    DATATYPES,
    FEW,
    FIXED_DATATYPES,
    FUZZ,
    HUGE_COUNTS,
    assert_client_error,
    assert_same_array,
    json_values,
    measure_peak,
    mutated,
    tensors,
)

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of stalling CI

_FIXED = 64 * 1024
_BYTES_ITEMS = st.lists(st.binary(max_size=16), max_size=12)


def _objects(items: list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


# BYTES: 4-byte little-endian length, then the element ---------------------------------------------------


@FUZZ
@given(items=_BYTES_ITEMS)
def test_bytes_tensors_round_trip_and_match_tritonclient(items):
    array = _objects(items)
    encoded = encode_bytes_tensor(array)
    theirs = serialize_byte_tensor(array)
    assert encoded == (theirs.item() if theirs.size else b"")
    assert_same_array(decode_bytes_tensor(encoded, len(items), "x"), array)
    if items:
        assert list(deserialize_bytes_tensor(encoded)) == items


@FUZZ
@given(items=_BYTES_ITEMS, data=st.data())
def test_mutated_bytes_tensors_decode_exactly_or_are_refused(items, data):
    """Lengths, bytes and counts changed: either exactly ``count`` elements whose encoding is the buffer,
    or Triton's element-count / truncation error; memory by the bytes received."""
    buffer = data.draw(mutated(encode_bytes_tensor(_objects(items))))
    count = data.draw(st.sampled_from([len(items), len(items) + 1, max(len(items) - 1, 0)]) | st.integers(0, 32)
                      | st.sampled_from(HUGE_COUNTS))
    with measure_peak() as peak:
        try:
            decoded = decode_bytes_tensor(memoryview(buffer), count, "x")
        except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
            assert isinstance(exc, InputMismatch), repr(exc)
            assert_client_error(exc)
        else:
            assert decoded.shape == (count,) and encode_bytes_tensor(decoded) == buffer
    assert peak[0] <= 64 * len(buffer) + _FIXED


@FEW
@given(count=st.sampled_from(HUGE_COUNTS), length=st.sampled_from([0, 1, 2**31, 2**32 - 1]),
       tail=st.binary(max_size=16))
def test_a_bytes_count_or_length_beyond_the_buffer_allocates_nothing_for_it(count, length, tail):
    buffer = length.to_bytes(4, "little") + tail
    with measure_peak() as peak, pytest.raises(InputMismatch):
        decode_bytes_tensor(buffer, count, "x")
    assert peak[0] < _FIXED


# Raw fixed-size tensors ------------------------------------------------------------------------------------


@FUZZ
@given(datatype_array=tensors(DATATYPES), data=st.data())
def test_raw_tensors_decode_in_place_or_are_refused(datatype_array, data):
    """A tensor's raw bytes, possibly mutated, against its declared (possibly changed) shape."""
    datatype, array = datatype_array
    raw = encode_bytes_tensor(array) if datatype == "BYTES" else array.tobytes()
    changed = data.draw(st.booleans())
    if changed:
        raw = data.draw(mutated(raw))
    shape = array.shape if not data.draw(st.booleans()) else tuple(data.draw(st.lists(st.integers(0, 6), max_size=3)))
    count = math.prod(shape)
    with measure_peak() as peak:
        try:
            decoded = decode_raw_tensor(memoryview(raw), datatype, shape, count, "x")
        except Exception as exc:  # noqa: BLE001
            assert isinstance(exc, InputMismatch), repr(exc)
            assert_client_error(exc)
        else:
            assert decoded.shape == shape
            if datatype == "BYTES":
                assert encode_bytes_tensor(decoded) == raw
            else:
                assert decoded.tobytes() == raw and (not decoded.size or not decoded.flags.owndata)  # a view
            if not changed and shape == array.shape:
                assert_same_array(decoded, array)
    assert peak[0] <= 64 * len(raw) + _FIXED


# Declared shapes and datatypes -----------------------------------------------------------------------------


_SHAPE_VALUES = (json_values() | st.lists(st.integers(-2, 2**64 + 1), max_size=MAX_DIMS + 2)
                 | st.lists(st.sampled_from((0, 1, *HUGE_COUNTS)), max_size=4).map(tuple)
                 | st.lists(st.sampled_from((0, 2**20, 2**30, 2**31)), max_size=MAX_DIMS))


@FUZZ
@given(raw=_SHAPE_VALUES, limit=st.sampled_from([1, 2**20, 2**30, 2**40, 2**62]),
       datatype=st.sampled_from(DATATYPES))
def test_any_declared_shape_is_checked_before_anything_is_sized_from_it(raw, limit, datatype):
    with measure_peak() as peak:
        try:
            shape, count = check_shape(raw, "x", limit, element_size(datatype))
        except Exception as exc:  # noqa: BLE001
            assert isinstance(exc, InvalidInput), repr(exc)
            assert_client_error(exc)
        else:
            assert list(shape) == list(raw) and all(type(d) is int and d >= 0 for d in shape)
            assert len(shape) <= MAX_DIMS and count == math.prod(shape) <= min(limit, MAX_ELEMENTS)
            assert all(d <= min(limit, MAX_ELEMENTS) for d in shape)
            np.empty((0, *shape), dtype=numpy_dtype(datatype))  # a shape numpy makes (sized, not allocated)
    assert peak[0] < _FIXED


@pytest.mark.parametrize("shape", [[0, 2**30, 2**30], [2**30, 0, 2**30], [0, 2**20, 2**20, 2**20], [0, 2**62]])
@pytest.mark.parametrize("datatype", ["BOOL", "FP64", "BYTES"])
def test_a_zero_element_shape_numpy_cannot_make_is_refused(shape, datatype):
    """Found by fuzzing: [0, 2**30, 2**30] has no elements, yet numpy makes no FP64 array of that shape
    (it sizes by the non-zero dimensions), so decoding it raised ValueError (a 500, INTERNAL over gRPC)."""
    with pytest.raises(InvalidInput, match="max_tensor_elements"):
        check_shape(shape, "x", 2**30, element_size(datatype))


@FEW
@given(datatype=json_values(2) | st.sampled_from([*DATATYPES, "fp32", "TYPE_FP32", "STRING", "FP8", " FP32"]))
def test_any_datatype_value_is_a_known_datatype_or_refused(datatype):
    try:
        size = datatype_size(datatype, "x")
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, InvalidInput), repr(exc)
        assert_client_error(exc)
    else:
        assert datatype in DATATYPES and size == element_size(datatype)


@FEW
@given(datatype=st.sampled_from(FIXED_DATATYPES), count=st.sampled_from(HUGE_COUNTS[:6]), raw=st.binary(max_size=64))
def test_a_raw_tensor_shorter_than_its_shape_is_refused_in_tritons_words(datatype, count, raw):
    with measure_peak() as peak, pytest.raises(InputMismatch) as refused:
        decode_raw_tensor(raw, datatype, (count,), count, "x")
    assert peak[0] < _FIXED
    assert refused.value.finish("m").message.startswith("[request id: <id_unknown>] input byte size mismatch")


# Shared-memory parameters ------------------------------------------------------------------------------------


_SHM_KEYS = st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset", "other"])


@FUZZ
@given(params=st.dictionaries(_SHM_KEYS, json_values(2) | st.integers(-1, 2**64 + 1) | st.text(max_size=4)))
def test_any_shared_memory_parameters_name_a_region_or_are_refused(params):
    try:
        ref = shared_memory_ref(params, "input 'x'")
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, InvalidInput), repr(exc)
        assert_client_error(exc)
        return
    if ref is None:
        assert not {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"} & set(params)
        return
    assert ref.region == params["shared_memory_region"] and isinstance(ref.region, str) and ref.region
    assert 0 <= ref.byte_size < 2**64 and 0 <= ref.offset < 2**64
    assert shared_memory_ref(ref.parameters(), "input 'x'") == ref  # the parameters a response carries read back
