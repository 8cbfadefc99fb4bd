"""Accuracy against a reference, and timing."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from appliance.core.errors import ApplianceError

__all__ = ["error_reason", "max_abs_error", "rate_concurrent", "time_runs", "within_tolerance"]


def error_reason(exc: BaseException) -> str:
    """What went wrong, in the words of our errors (their message) or of the runtime's."""
    message = exc.message if isinstance(exc, ApplianceError) else ""
    return message or f"{type(exc).__name__}: {exc}"


def max_abs_error(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for name, expected in reference.items():
        got = candidate.get(name)
        if got is None or np.shape(got) != np.shape(expected):
            return float("inf")
        if expected.dtype == object:
            if list(got.ravel()) != list(expected.ravel()):
                return float("inf")
            continue
        difference = np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64))
        if difference.size:
            worst = max(worst, float(np.nanmax(difference)) if not np.isnan(difference).all() else float("inf"))
    return worst


def within_tolerance(reference: Mapping[str, np.ndarray], error: float, atol: float, rtol: float) -> bool:
    scale = max((float(np.max(np.abs(v))) for v in reference.values() if v.dtype != object and v.size), default=0.0)
    return error <= atol + rtol * scale


def time_runs(run: Callable[[], object], budget: float, min_runs: int = 5, max_runs: int = 200) -> float:
    """Median seconds per call after warm-up, sampling for about ``budget`` seconds."""
    for _ in range(3):
        run()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < min_runs or (time.perf_counter() - started < budget and len(samples) < max_runs):
        begin = time.perf_counter()
        run()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def rate_concurrent(runs: Sequence[Callable[[], object]], budget: float) -> float:
    """Calls per second with every ``run`` looping on a thread of its own for about ``budget`` seconds
    (each runs at least once after a warm-up call); the first error any of them raises is raised."""
    for run in runs:
        run()
    counts = [0] * len(runs)
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        try:
            while True:
                runs[index]()
                counts[index] += 1
                if stop.is_set():
                    return
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,), name=f"tune-rate-{i}") for i in range(len(runs))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    stop.wait(budget)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(counts) / elapsed
