"""System shared memory as the REST and gRPC end-to-end tests use it: the example model ``simple``'s two
INT32 [1, 16] inputs, X and Y, laid one after the other in a region made by the ``regions`` fixture."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tritonclient.utils.shared_memory as shm

X = np.arange(16, dtype=np.int32).reshape(1, 16)
Y = np.full((1, 16), 3, dtype=np.int32)
SIZE = X.nbytes  # 64


def filled_region(regions: Callable, arrays: tuple[np.ndarray, ...] = (X, Y)) -> tuple[str, object]:
    """(key, handle) of a new region holding ``arrays`` back to back: by default X at offset 0 and Y at SIZE,
    2 * SIZE bytes in all."""
    key, handle = regions(sum(array.nbytes for array in arrays))
    offset = 0
    for array in arrays:
        shm.set_shared_memory_region(handle, [array], offset=offset)
        offset += array.nbytes
    return key, handle
