"""What runs on an instance's thread: gather a batch's inputs, execute, split the outputs back.

Concatenation and splitting happen here, off the event loop, so large inputs never stall it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from appliance.backends import Backend
from appliance.core.stats import BatchTiming
from appliance.errors import InferenceFailed

__all__ = ["execute_batch"]


def _gather_inputs(requests: Sequence[Mapping[str, np.ndarray]]) -> Mapping[str, np.ndarray]:
    if len(requests) == 1:
        return requests[0]
    return {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}


def _split_outputs(
    results: Mapping[str, np.ndarray], sizes: Sequence[int], wanted: Sequence[Sequence[str]]
) -> list[dict[str, np.ndarray]]:
    if len(sizes) == 1:
        return [{name: results[name] for name in wanted[0] if name in results}]
    total = sum(sizes)
    for name, value in results.items():
        if np.ndim(value) == 0 or value.shape[0] != total:
            raise InferenceFailed(
                f"output '{name}' has shape {list(np.shape(value))}, but the batch held {total} items; "
                "the model does not return one row per batch item, so it cannot be batched "
                "(remove dynamic_batching or set max_batch_size: 0)"
            )
    bounds = np.cumsum([0, *sizes])
    return [
        {name: results[name][bounds[i] : bounds[i + 1]] for name in names if name in results}
        for i, names in enumerate(wanted)
    ]


def execute_batch(
    backend: Backend,
    inputs: Sequence[Mapping[str, np.ndarray]],
    sizes: Sequence[int],
    wanted: Sequence[Sequence[str]],
    outputs: Sequence[str],
    parameters: Sequence[Mapping[str, object]],
) -> tuple[list[dict[str, np.ndarray] | BaseException], BatchTiming]:
    """Run requests as one batch; ``wanted[i]`` are the outputs request ``i`` asked for.

    Backends that take requests separately (Triton's Python backend) get them as a list and may fail
    each one on its own; the others get the inputs concatenated along the batch dimension.
    """
    start = time.perf_counter_ns()
    if backend.takes_requests:
        per_request = backend.run_requests(inputs, wanted, parameters)
        done = time.perf_counter_ns()
        return per_request, BatchTiming(0, done - start, 0)
    feed = _gather_inputs(inputs)
    gathered = time.perf_counter_ns()
    results = backend.run(feed, outputs)
    ran = time.perf_counter_ns()
    split: list[dict[str, np.ndarray] | BaseException] = list(_split_outputs(results, sizes, wanted))
    done = time.perf_counter_ns()
    return split, BatchTiming(gathered - start, ran - gathered, done - ran)
