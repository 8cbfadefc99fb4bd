"""Triton's classification extension: replace an output by its top-k entries as "value:index[:label]"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from appliance.core.errors import InvalidInput
from appliance.engine.model_files import MAX_LABEL_BYTES, confined, read_bounded

__all__ = ["MAX_CLASSIFICATION_ELEMENTS", "classify", "read_labels"]

MAX_CLASSIFICATION_ELEMENTS = 1_000_000
"""Triton's bound (kMaxClassificationElements)."""


def read_labels(model_dir: Path, label_filename: str, field: str = "label_filename") -> list[str]:
    """The labels of a classification output, one a line, from a file inside the model's directory."""
    if not label_filename:
        return []
    raw = read_bounded(confined(model_dir, label_filename, field), MAX_LABEL_BYTES, field)
    return raw.decode("utf-8", "replace").splitlines()


def classify(name: str, data: np.ndarray, count: int, labels: list[str], batched: bool) -> np.ndarray:
    """Top ``count`` classes of each batch item (or of the whole tensor when unbatched), as BYTES."""
    if data.dtype == object:
        raise InvalidInput(f"class result not available for output due to unsupported type 'BYTES'; output '{name}' "
                           "holds BYTES and cannot be classified")  # Triton's words (its server dies of it in 2.51)
    if data.size > MAX_CLASSIFICATION_ELEMENTS:  # sorting it would cost the server, not the client
        raise InvalidInput(
            f"classification output tensor too large: output '{name}' has {data.size} elements, at most "
            f"{MAX_CLASSIFICATION_ELEMENTS} can be classified; request it without classification"
        )
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim else data.reshape(1, -1)
    count = min(count, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :count]
    result = np.empty((rows.shape[0], count), dtype=object)
    for r, indices in enumerate(order):
        for c, index in enumerate(indices):
            text = f"{float(rows[r, index]):f}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    return result if batched else result.reshape(count)
