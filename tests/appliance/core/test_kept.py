"""The bound on the key sets the appliance's tables keep, and the tables held to it."""

from __future__ import annotations

import pytest

from appliance.backends import base
from appliance.core.kept import MAX_KEPT_KEY_LENGTH, MAX_KEPT_KEYS, kept_keys
from appliance.rest import codec, infer_body


@pytest.mark.parametrize(("keys", "kept"), [
    (("sequence_id", "sequence_start", "sequence_end"), True),
    ((), True),
    (tuple(f"k{i}" for i in range(MAX_KEPT_KEYS)), True),
    (tuple(f"k{i}" for i in range(MAX_KEPT_KEYS + 1)), False),
    (("x" * MAX_KEPT_KEY_LENGTH,), True),
    (("x" * (MAX_KEPT_KEY_LENGTH + 1),), False),
    ((1, "a"), False),
])
def test_only_small_sets_of_short_keys_are_kept(keys, kept):
    assert kept_keys(keys) is kept


def test_a_clients_long_keys_are_read_every_time_and_never_kept():
    long = "own_" + "x" * 1000
    for _ in range(2):
        assert base.model_parameters({long: 1, "sequence_id": 3}) == f'{{"{long}": 1}}'
    assert (long, "sequence_id") not in base._TRANSPORT_ONLY
    header = b'{"parameters": {"%s": 1}, "inputs": []}' % long.encode()
    for _ in range(2):
        assert codec.decode_infer_request(header).parameters == {long: 1}
    assert (long,) not in codec._UNRESERVED


def test_a_padded_header_length_is_read_and_never_kept():
    padded = " " * 100 + "12"
    assert infer_body._header_length(padded) == 12
    assert padded not in infer_body._LENGTHS
