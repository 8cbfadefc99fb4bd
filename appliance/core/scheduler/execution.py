"""What runs on an instance's thread: one batch through the backend, timed.

The backend gathers inputs and splits outputs (by default, concatenation along the batch dimension:
see appliance.backends.base), here off the event loop, so large inputs never stall it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from appliance.backends import Backend, BackendRequest
from appliance.core.stats import BatchTiming

__all__ = ["execute_batch"]


def execute_batch(
    backend: Backend, requests: Sequence[BackendRequest]
) -> tuple[list[dict[str, np.ndarray] | BaseException], BatchTiming]:
    """Run requests as one batch: one result (or that request's error) per request, and what it cost."""
    # monotonic_ns, not perf_counter_ns: the start and end go into traces beside the front ends' times.
    start = time.monotonic_ns()
    batch = backend.run_requests(requests)
    end = time.monotonic_ns()
    infer = max(0, end - start - batch.input_ns - batch.output_ns)
    return batch.results, BatchTiming(batch.input_ns, infer, batch.output_ns, start, end)
