"""Shape checks in Triton's words where Triton has them (its qa L0_http test_buffer_size_overflow)."""

from __future__ import annotations

import pytest

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.engine.tensor_checks import MAX_ELEMENTS, check_shape


def test_an_element_count_past_64_bits_is_refused_in_tritons_words():
    with pytest.raises(InvalidInput, match="causes total element count to exceed maximum size of"):
        check_shape([2**4, 2**60 + 2], "INPUT0", 1 << 30, itemsize=4)


def test_a_byte_size_past_64_bits_is_refused_in_tritons_words():
    with pytest.raises(InvalidInput, match="^byte size overflow for input 'INPUT0'"):
        check_shape([2**2, 2**60 + 2], "INPUT0", 1 << 30, itemsize=4)


def test_a_negative_dimension_carries_tritons_words_for_the_model():
    with pytest.raises(InputMismatch) as refused:
        check_shape([1, -1], "x", 1 << 30)
    assert refused.value.finish("m").message == (
        "[request id: <id_unknown>] All input dimensions should be specified for input 'x' for model 'm', got [1,-1]")


def test_a_shape_within_bounds_passes():
    assert check_shape([2, 3], "x", 1 << 30, itemsize=4) == ((2, 3), 6)


def test_a_bounded_shape_cannot_overflow_so_its_overflow_tests_can_be_skipped():
    """check_shape returns a shape within the bound before its 64-bit overflow tests: no element type
    (16 bytes at most) makes MAX_ELEMENTS of them overflow."""
    assert MAX_ELEMENTS * 16 < 2**64
    assert check_shape([2, 3], "x", 100, 8) == ((2, 3), 6)
