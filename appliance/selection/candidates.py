"""Measure candidate plans: build a plan's instances, check the first against the reference outputs, time
its latency alone (one request at a time, the smallest batch) and its items/s with every instance busy
(the largest batch). The two best for the objective, when close, are timed again in alternating rounds:
a burst of other load on the box during one plan's timing must not decide the choice.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from appliance.backends import Backend, BackendInfo, LoadContext
from appliance.core.errors import ConfigError
from appliance.selection.inputs import InputSearch, InputSet
from appliance.selection.measure import error_reason, max_abs_error, rate_concurrent, time_runs, within_tolerance
from appliance.selection.plans import Plan

__all__ = ["BATCH_SIZES", "BATCH_WITHIN", "CONFIRM_ROUNDS", "CONFIRM_WITHIN", "CandidateBench", "batch_cap", "best",
           "metric_of"]

log = logging.getLogger(__name__)

CONFIRM_WITHIN = 0.15
"""Finalists whose first timings differ by less than this fraction are timed again."""
CONFIRM_ROUNDS = 3
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Batch sizes the chosen plan's throughput is measured at (up to the model's max_batch_size)."""
BATCH_WITHIN = 0.05
"""The batcher's cap is the largest size whose items/s is within this fraction of the best size's."""


def batch_cap(items_per_s: dict[int, float], max_batch_size: int) -> int | None:
    """The largest batch worth forming: the largest measured size within BATCH_WITHIN of the best
    throughput, or None when that is the largest size the model takes (nothing to cap)."""
    if not items_per_s:
        return None
    top = max(items_per_s.values())
    cap = max(size for size, rate in items_per_s.items() if rate >= (1 - BATCH_WITHIN) * top)
    return None if cap >= max_batch_size else cap


def metric_of(objective: str) -> str:
    """The row field an objective ranks by."""
    return "throughput" if objective == "throughput" else "latency_ms"


def _ranked(rows: list[dict[str, Any]], objective: str) -> list[dict[str, Any]]:
    key = metric_of(objective)
    return sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r[key], reverse=objective == "throughput")


def best(rows: list[dict[str, Any]], objective: str) -> str | None:
    """The plan id of the best measured row for the objective; None when no row measured."""
    ranked = _ranked(rows, objective)
    return ranked[0]["plan"] if ranked else None


@dataclasses.dataclass
class CandidateBench:
    """Measures the candidate plans of one model version, all against the same inputs and reference."""

    backends: Sequence[BackendInfo]
    info: BackendInfo
    context: LoadContext
    search: InputSearch
    staging: Path
    tolerance: Callable[[Plan], tuple[float, float]]
    budget: float
    build_timeout: float
    concurrency: int = 0
    """Requests in flight in the model's traffic; 0 (unknown): throughput keeps every instance busy."""
    _reference: dict[int, dict] = dataclasses.field(default_factory=dict, init=False)

    def measure(self, plan: Plan) -> dict[str, Any]:
        row: dict[str, Any] = {**plan.as_json(), "status": "failed", "latency_ms": None, "throughput": None,
                               "max_abs_error": None, "reason": ""}
        instances: list[Backend] = []
        try:
            instances = self._build_instances(plan)
            inputs = self.search.find(instances[0])
            if inputs is None:
                row["reason"] = "built, but refused every tuning input (see inputs_refused)"
                return row
            results = [instances[0].run(sample.inputs, self.search.outputs) for sample in inputs.samples]
            if not self._reference:
                self._reference.update(enumerate(results))  # the first plan that builds is the fp32 CPU reference
            error = max(max_abs_error(self._reference[i], result) for i, result in enumerate(results))
            row["max_abs_error"] = error
            atol, rtol = self.tolerance(plan)
            if not all(within_tolerance(self._reference[i], error, atol, rtol) for i in self._reference):
                row.update(status="rejected", reason=f"max abs error {error:.3g} exceeds atol {atol:g} + rtol {rtol:g}")
                return row
            row.update(status="ok", latency_ms=self._latency_ms(instances, inputs, self.budget),
                       throughput=self._throughput(instances, inputs, self.budget))
        except Exception as exc:  # a candidate that cannot build or run is a result, not an error
            row["reason"] = error_reason(exc)
        finally:
            _close(instances)
        return row

    def confirm(self, rows: list[dict[str, Any]], plans: Sequence[Plan], objective: str) -> None:
        """Time the two best rows again, alternately, and keep the median of the rounds in their rows."""
        finalists = _ranked(rows, objective)[:2]
        key = metric_of(objective)
        if len(finalists) < 2 or self.search.found is None:
            return
        best, second = finalists[0][key], finalists[1][key]
        if abs(best - second) > CONFIRM_WITHIN * min(best, second):
            return
        log.info("tuning %s: %s and %s are within %d %%: timing them again in %d alternating rounds",
                 self.context.model_name, finalists[0]["plan"], finalists[1]["plan"], CONFIRM_WITHIN * 100,
                 CONFIRM_ROUNDS)
        by_id = {plan.id: plan for plan in plans}
        built: list[list[Backend]] = []
        try:
            for row in finalists:
                built.append(self._build_instances(by_id[row["plan"]]))
            timer = self._latency_ms if objective == "latency" else self._throughput
            rounds: list[list[float]] = [[], []]
            for _ in range(CONFIRM_ROUNDS):
                for index, instances in enumerate(built):
                    rounds[index].append(timer(instances, self.search.found, self.budget / 2))
        except Exception as exc:  # the first timings stand
            log.warning("tuning %s: timing the finalists again failed (%s); the first timings decide",
                        self.context.model_name, error_reason(exc))
            return
        finally:
            for instances in built:
                _close(instances)
        for row, values in zip(finalists, rounds):
            row[key] = round(statistics.median(values), 4 if key == "latency_ms" else 1)
            row["timed_again"] = True

    def batch_curve(self, plan: Plan, max_batch_size: int) -> dict[int, float]:
        """Items/s of ``plan`` at each batch size up to ``max_batch_size``, every instance busy: where the
        runtime's throughput peaks below the largest batch, the batcher should not form larger ones
        (Model Analyzer's job, done on the box). Empty when the tuning inputs cannot be tiled."""
        found = self.search.found
        if found is None or max_batch_size < 2:
            return {}
        smallest = min(found.samples, key=lambda sample: sample.batch)
        if smallest.batch != 1:
            return {}
        rates: dict[int, float] = {}
        instances = self._build_instances(plan)
        try:
            busy = instances[: self.concurrency] if self.concurrency else instances
            for size in (b for b in BATCH_SIZES if b <= max_batch_size):
                inputs = {name: np.repeat(array, size, axis=0) for name, array in smallest.inputs.items()}
                runs = [functools.partial(b.run, inputs, self.search.outputs) for b in busy]
                rates[size] = round(size * rate_concurrent(runs, self.budget / 2), 1)
        finally:
            _close(instances)
        return rates

    def _build_instances(self, plan: Plan) -> list[Backend]:
        target = next((b for b in self.backends if b.name == plan.backend), self.info)
        artefacts = self.staging / plan.id.replace(":", "_").replace("+", "_")
        artefacts.mkdir(exist_ok=True)
        context = dataclasses.replace(self.context, config=plan.apply(self.context.config), artefacts=artefacts,
                                      threads=plan.threads or self.context.threads, plan=plan.id)
        instances: list[Backend] = []
        try:
            for index in range(max(1, sum(group.count for group in context.config.instance_group))):
                instances.append(_build(target, dataclasses.replace(context, instance_index=index), self.build_timeout))
        except BaseException:
            _close(instances)
            raise
        return instances

    def _latency_ms(self, instances: list[Backend], inputs: InputSet, budget: float) -> float:
        smallest = min(inputs.samples, key=lambda sample: sample.batch)
        return round(time_runs(lambda: instances[0].run(smallest.inputs, self.search.outputs), budget) * 1000, 4)

    def _throughput(self, instances: list[Backend], inputs: InputSet, budget: float) -> float:
        largest = max(inputs.samples, key=lambda sample: sample.batch)
        busy = instances[: self.concurrency] if self.concurrency else instances  # no more than are asked for
        rate = rate_concurrent([functools.partial(b.run, largest.inputs, self.search.outputs) for b in busy], budget)
        return round(largest.batch * rate, 1)


def _build(info: BackendInfo, context: LoadContext, timeout: float) -> Backend:
    """Load one instance, giving up after ``timeout`` (a hung compile leaves only its thread behind)."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tune-build")
    future = pool.submit(info.load, context)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise ConfigError(f"building took longer than {timeout:.0f} s") from None
    finally:
        pool.shutdown(wait=False)


def _close(instances: list[Backend]) -> None:
    for backend in instances:
        backend.close()
