from __future__ import annotations

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.core.tensors import (
    CONFIG_TO_V2,
    V2_TO_CONFIG,
    decode_bytes_tensor,
    element_size,
    encode_bytes_tensor,
    numpy_dtype,
    v2_datatype,
)


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"])
def test_fixed_size_datatypes_round_trip_through_numpy(datatype):
    assert v2_datatype(numpy_dtype(datatype)) == datatype
    assert element_size(datatype) == numpy_dtype(datatype).itemsize


def test_strings_of_any_numpy_kind_are_bytes():
    assert v2_datatype(np.dtype(object)) == v2_datatype(np.dtype("S3")) == v2_datatype(np.dtype("U3")) == "BYTES"
    assert element_size("BYTES") is None


def test_bf16_is_ml_dtypes_bfloat16_as_tritonclient_has_it():
    from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

    assert CONFIG_TO_V2["TYPE_BF16"] == "BF16" and element_size("BF16") == 2
    assert numpy_dtype("BF16") == triton_to_np_dtype("BF16") and np_to_triton_dtype(numpy_dtype("BF16")) == "BF16"
    values = np.array([1.5, -2.0, 3.25], dtype=numpy_dtype("BF16"))
    assert v2_datatype(values.dtype) == "BF16" and v2_datatype(np.dtype(np.uint16)) == "UINT16"
    # The wire format: each element's 16 bits, little endian (the top half of the FP32 bit pattern).
    assert values.tobytes() == (np.array([1.5, -2.0, 3.25], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    with pytest.raises(ValueError, match="expected one of"):
        numpy_dtype("FP8")


def test_config_names_map_both_ways():
    assert V2_TO_CONFIG["BYTES"] == "TYPE_STRING" and CONFIG_TO_V2["TYPE_STRING"] == "BYTES"
    assert all(CONFIG_TO_V2[V2_TO_CONFIG[name]] == name for name in V2_TO_CONFIG)


def test_bytes_encoding_round_trips_and_encodes_other_objects_as_utf8_text():
    array = np.array([[b"", b"\xff\x00"], ["é", 7]], dtype=object)
    raw = encode_bytes_tensor(array)
    assert raw[:4] == b"\0\0\0\0"
    assert list(decode_bytes_tensor(raw, 4, "t")) == [b"", b"\xff\x00", "é".encode(), b"7"]


def test_a_bytes_count_larger_than_the_buffer_is_refused_before_allocating():
    # Elements are counted from the bytes received: a count of two billion over an empty buffer is
    # refused at once, with nothing sized by the count.
    with pytest.raises(InvalidInput, match="holds 0 BYTES elements, the shape needs 2000000000"):
        decode_bytes_tensor(b"", 2_000_000_000, "t")
