"""Per-model scheduling between the request path and the instances.

``DirectScheduler`` is Triton's default scheduler: each request executes alone, on the next free
instance, in arrival order.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import numpy as np

from appliance.core.instances import InstancePool

__all__ = ["DirectScheduler", "Scheduler"]


class Scheduler(abc.ABC):
    def __init__(self, pool: InstancePool) -> None:
        self.pool = pool

    def start(self) -> None:
        self.pool.start()

    @abc.abstractmethod
    async def submit(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int
    ) -> dict[str, np.ndarray]:
        """Execute one request's inputs and return its outputs."""

    async def drain(self, timeout: float) -> bool:
        return await self.pool.drain(timeout)

    def close(self) -> list[BaseException]:
        return self.pool.close()


class DirectScheduler(Scheduler):
    async def submit(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], batch_size: int
    ) -> dict[str, np.ndarray]:
        return await self.pool.run(inputs, outputs)
