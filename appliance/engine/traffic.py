"""What one served model version sees: the shapes of its requests (per item: without the batch dimension
when the model batches), their batch sizes and how many requests were in flight with each.

Memory is bounded: at most MAX_SHAPES distinct shapes are counted, any others only as ``other``; batch
sizes and in-flight counts are bounded by the request limits. Recorded on the event loop, one dict
update per request.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appliance.engine.types import InferInput

__all__ = ["MAX_SHAPES", "ItemShapes", "TrafficStats"]

MAX_SHAPES = 32

ItemShapes = tuple[tuple[str, tuple[int, ...]], ...]
"""(input name, dims) pairs in input order."""


class TrafficStats:
    def __init__(self, batched: bool) -> None:
        self._batched = batched
        self._start = 1 if batched else 0
        """Where an item's dimensions start in a request's shape (past the batch dimension)."""
        self.requests = 0
        self._shapes: collections.Counter[ItemShapes] = collections.Counter()
        self._other = 0
        self._batches: collections.Counter[int] = collections.Counter()
        self._in_flight: collections.Counter[int] = collections.Counter()

    def shapes(self, inputs: Sequence[InferInput]) -> ItemShapes:
        """What ``record`` counts of a request: its inputs' names and item shapes, in order."""
        start = self._start
        if len(inputs) == 1:  # the common request: one input
            tensor = inputs[0]
            return ((tensor.name, tensor.data.shape[start:]),)
        return tuple((tensor.name, tensor.data.shape[start:]) for tensor in inputs)

    def record(self, item: ItemShapes, batch: int, in_flight: int) -> None:
        """One valid request: its inputs' shapes as the client sent them (``shapes``; a caller that has
        seen the request's form before keeps what ``shapes`` made of it)."""
        self.requests += 1
        shapes = self._shapes
        seen = shapes.get(item)  # (one lookup of the key: its hash walks the nested tuples)
        if seen is not None:
            shapes[item] = seen + 1
        elif len(shapes) < MAX_SHAPES:
            shapes[item] = 1
        else:
            self._other += 1
        self._batches[batch] += 1
        self._in_flight[in_flight] += 1

    def dominant(self) -> tuple[dict[str, list[int]], float] | None:
        """The most common item shapes and their share of the requests; None before any request."""
        if not self._shapes:
            return None
        item, count = self._shapes.most_common(1)[0]
        return {name: list(dims) for name, dims in item}, count / self.requests

    def concurrency(self) -> int:
        """Requests in flight at the 90th percentile of arrivals (0 before any request)."""
        seen = 0
        for level in sorted(self._in_flight):
            seen += self._in_flight[level]
            if seen >= 0.9 * self.requests:
                return level
        return 0

    def profile(self) -> dict[str, Any] | None:
        """What to tune on: the dominant shapes at batch 1 and at the most common batch size (for a
        batching model), and the concurrency seen; None before any request."""
        dominant = self.dominant()
        if dominant is None:
            return None
        item, _ = dominant
        batches = sorted({1, self._batches.most_common(1)[0][0]}) if self._batched else [1]
        samples = [{"batch": batch, "shapes": {name: [batch, *dims] if self._batched else dims
                                               for name, dims in item.items()}} for batch in batches]
        return {"samples": samples, "concurrency": self.concurrency()}

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "shapes": [{"shapes": {name: list(dims) for name, dims in item}, "requests": count}
                       for item, count in self._shapes.most_common()],
            "other_shapes": self._other,
            "batch_sizes": {str(size): count for size, count in sorted(self._batches.items())},
            "concurrency_p90": self.concurrency(),
        }
