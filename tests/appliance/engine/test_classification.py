"""Classification of an output (Triton's classification extension)."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.engine.classification import classify


def test_top_classes_with_labels():
    scores = np.array([[0.1, 0.9, 0.3]], np.float32)
    assert [v.decode() for v in classify("y", scores, 2, ["a", "b", "c"], batched=True).ravel()] == [
        "0.900000:1:b", "0.300000:2:c"]


def test_a_bytes_output_is_refused_in_tritons_words():
    """Triton 2.51 dies of this request (SIGFPE); its later releases refuse it in these words."""
    with pytest.raises(InvalidInput, match="^class result not available for output due to unsupported type 'BYTES'"):
        classify("y", np.array([[b"a", b"b"]], dtype=object), 1, [], batched=True)
