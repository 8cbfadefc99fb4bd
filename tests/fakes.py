"""Backends for scheduler tests: FakeBackend sleeps, records every batch it runs, can raise;
TensorlessBackend and RequestsBackend are the bases a test's own stand-in builds on. Not runtime mocks:
they stand in for a model, and the scheduler under test is the real one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from appliance.backends import Backend


class _Counter:
    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


class TensorlessBackend(Backend):
    """A stand-in model that declares no tensors: the scheduler, pool and rate limiter tests call the model
    and never read its tensor descriptions. Subclasses say what ``run`` (or ``run_requests``) does."""

    def inputs(self):
        return []

    def outputs(self):
        return []


class RequestsBackend(TensorlessBackend):
    """A stand-in model answered through ``run_requests`` (a request at a time: reschedules, sinks), whose
    ``run`` must never be reached."""

    def run(self, inputs, outputs):
        raise AssertionError(f"{type(self).__name__} answers through run_requests; run() was called")


class FakeBackend(TensorlessBackend):
    """y = 2x; ``delay`` may be a number or a function of the inputs."""

    def __init__(self, delay: float | Callable[[dict], float] = 0.0, fail: str | None = None,
                 counter: _Counter | None = None) -> None:
        self.delay = delay
        self.fail = fail
        self.batches: list[list[float]] = []
        self.closed = False
        self._own = _Counter()
        self._shared = counter

    @staticmethod
    def shared_counter() -> _Counter:
        return _Counter()

    @property
    def max_active(self) -> int:
        return self._own.max_active

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    def run(self, inputs, outputs):
        counters = [c for c in (self._own, self._shared) if c is not None]
        for c in counters:
            c.enter()
        try:
            x = inputs["x"]
            self.batches.append([float(v) for v in x[:, 0]])
            time.sleep(self.delay(inputs) if callable(self.delay) else self.delay)
            if self.fail:
                raise RuntimeError(self.fail)
            return {name: x * 2 for name in (outputs or ["y"])}
        finally:
            for c in counters:
                c.leave()

    def close(self):
        self.closed = True
