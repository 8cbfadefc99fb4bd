"""Choose a plan per model version: cache hit, or build, check and time every candidate.

Tuning is blocking (it runs on a loader thread) and serialised: two models never time their candidates
at once, so each measurement has the box to itself, while models with a cached decision load freely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BACKENDS, BackendInfo, LoadContext, usable_cores
from appliance.core.errors import ConfigError
from appliance.repository.config import CONFIG_FILENAME, config_to_json
from appliance.repository.layout import file_digests
from appliance.runtime.state import StateDir
from appliance.selection.candidates import BATCH_WITHIN, CandidateBench, batch_cap, best
from appliance.selection.decision import ONLY_PLAN, Choice, build_decision, measured_outcome, plan_from
from appliance.selection.inputs import InputSearch, tuning_inputs
from appliance.selection.job import Hardware, SelectionSettings, TuneRequest, TuningJob
from appliance.selection.plans import (
    DEFAULT_PLAN,
    IN_PROCESS_PLAN,
    Plan,
    enumerate_plans,
    instance_variants,
    offers_in_process,
)
from model_cache import BrokenEntry, ModelCache, cache_key

# SelectionSettings and TuneRequest live with the job a tuning child gets; they are part of this API.
__all__ = ["Choice", "Hardware", "SelectionSettings", "Selector", "TuneRequest", "open_cache"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""progress(message, step, steps)"""

# Triton's optimization.execution_accelerators names -> our plans.
_ACCELERATORS = {"openvino": "onnxruntime+openvino:CPU", "tensorrt": "onnxruntime:TensorRT", "cuda": "onnxruntime:CUDA"}


def _parameter(config: mc.ModelConfig, key: str) -> str:
    value = config.parameters.get(key)
    return value.string_value.strip() if value is not None else ""


def _flag(config: mc.ModelConfig, key: str) -> bool:
    return _parameter(config, key).lower() in ("1", "true", "yes")


def _pinned(config: mc.ModelConfig) -> str:
    pinned = _parameter(config, "plan")
    if pinned:
        return pinned
    accelerators = config.optimization.execution_accelerators
    for accelerator in [*accelerators.gpu_execution_accelerator, *accelerators.cpu_execution_accelerator]:
        if accelerator.name in _ACCELERATORS:
            return _ACCELERATORS[accelerator.name]
    return ""


def _tolerance(config: mc.ModelConfig, plan: Plan, settings: SelectionSettings) -> tuple[float, float]:
    if plan.reduced_precision:
        atol, rtol = settings.reduced_atol, settings.reduced_rtol
    else:
        atol, rtol = settings.atol, settings.rtol
    override = _parameter(config, "tolerance")
    if override:
        try:
            atol = rtol = float(override)
        except ValueError:
            raise ConfigError(
                f"model {config.name!r}: parameter tolerance must be a number, got {override!r}"
            ) from None
    return atol, rtol


def _selection_inputs(config: mc.ModelConfig) -> dict[str, Any]:
    """The parts of a config that change what selection measures (and so the cache key)."""
    document = config_to_json(config)
    return {k: document.get(k) for k in ("max_batch_size", "input", "output", "parameters", "optimization",
                                          "model_warmup", "default_model_filename", "instance_group")}


def open_cache(root: Path, max_bytes: int, state: StateDir) -> ModelCache:
    """The model cache as the state dir allows: read-only when the dir is, with broken entries reported."""

    def report(entry: BrokenEntry) -> None:
        state.note("cache_entry_unreadable",
                   f"model cache entry {entry.key} cannot be used ({entry.reason}): treated as a miss"
                   + (", removed" if entry.removed else ", left in place"),
                   "nothing to do when it was removed (the model is measured again); otherwise "
                   "`appliance cache clear` once the state dir is writable")

    try:
        return ModelCache(root, max_bytes, writable=state.writable, on_broken=report)
    except OSError as exc:  # e.g. <state>/cache is a file: serve without storing decisions
        state.note("cache_not_saved", f"the model cache {root} cannot be created ({exc}); measured plans are "
                   f"not kept", f"remove or fix {root} and restart the daemon")
        return ModelCache(root, max_bytes, writable=False, on_broken=report)


class Selector:
    def __init__(self, hardware: Hardware, cache: ModelCache | None, settings: SelectionSettings = SelectionSettings(),
                 *, isolate: bool = False, state: StateDir | None = None, extra_plans: tuple[Plan, ...] = (),
                 backends: tuple[BackendInfo, ...] = BACKENDS) -> None:
        """``isolate``: measure in a child process (the daemon), not in this one (the CLI, the child).
        ``state``: where problems with the cache are recorded (the daemon's); None (a tuning child,
        whose daemon reports them) logs them only. ``extra_plans`` and the ``backends`` that run
        them: candidates beyond this box's own (tests inject a faulty one)."""
        self._hardware = hardware
        self._cache = cache
        self._settings = settings
        self._extra_plans = extra_plans
        self._backends = backends
        self._isolate = isolate and cache is not None
        self._state = state
        self._tuning = threading.Lock()
        self.progress: Progress | None = None
        """Where tuning reports its steps besides the log (the CLI's progress bar)."""

    def plans_for(self, info: BackendInfo, config: mc.ModelConfig, explicit_instances: bool = False,
                  threads: int = 0) -> tuple[list[Plan], dict[str, str]]:
        """Candidate plans after pins and exclusions, and why the others were left out. CPU plans come
        in instance x thread variants unless the config's own instance_group fixes the instances (and
        does not set parameters tune_instances); ``threads`` fixes the threads (the settings')."""
        plans = [*enumerate_plans(info.name, self._hardware.probe, self._hardware.cpu_flags), *self._extra_plans]
        if info.name == "python" and offers_in_process(config):
            plans.append(IN_PROCESS_PLAN)
        if not explicit_instances or _flag(config, "tune_instances"):
            plans = instance_variants(plans, usable_cores(), threads)
        skipped: dict[str, str] = {}
        excluded = [p.strip() for p in _parameter(config, "exclude_plans").split(",") if p.strip()]
        pinned = _pinned(config)
        allow_reduced = _flag(config, "allow_reduced_precision")
        if pinned and pinned not in {p.id for p in plans} | {p.base for p in plans}:
            raise ConfigError(
                f"model {config.name!r} pins plan {pinned!r}, which cannot run here; plans: {[p.id for p in plans]}"
            )
        kept = []
        for index, plan in enumerate(plans):
            if index == 0:
                kept.append(plan)  # the fp32 reference always runs: the others are checked against it
            elif pinned and pinned not in (plan.id, plan.base):
                skipped[plan.id] = f"the model pins {pinned}"
            elif any(e in (plan.id, plan.base) or plan.id.startswith(e + ":") for e in excluded):
                skipped[plan.id] = "excluded by parameters.exclude_plans"
            elif plan.reduced_precision and not allow_reduced and pinned not in (plan.id, plan.base):
                skipped[plan.id] = "reduced precision; set parameters allow_reduced_precision to consider it"
            else:
                kept.append(plan)
        return kept, skipped

    def _key(self, version_dir: Path, config: mc.ModelConfig, request: TuneRequest = TuneRequest()) -> str:
        # A decision per traffic profile: a model whose traffic comes back to known shapes switches to
        # the plan measured for them without measuring again.
        # Every file the model can read (a Python model's helper modules too), but for config.pbtxt:
        # the parts of the config selection depends on are in the key already (_selection_inputs).
        files = {name: value for name, value in file_digests(version_dir.parent, version_dir).items()
                 if name != CONFIG_FILENAME}
        return cache_key(files, config=_selection_inputs(config),
                         fingerprint=self._hardware.fingerprint, runtimes=self._hardware.runtime_versions,
                         request=dataclasses.asdict(request))

    def choose(self, info: BackendInfo, context: LoadContext, force: bool = False,
               progress: Progress | None = None, key: str | None = None,
               request: TuneRequest = TuneRequest()) -> Choice:
        """The plan to serve ``context``'s model version with: cached, or measured now. ``key`` is the
        cache key when the caller already computed it (a tuning child process gets the daemon's)."""
        key = key or self._key(context.version_dir, context.config, request)
        if self._cache is not None and not force:
            cached = self._cached(key, context)
            if cached is not None:
                return cached
        plans, skipped = self.plans_for(info, context.config, request.explicit_instances,
                                        context.options.intra_op_threads)
        if len(plans) == 1 and not skipped:
            # One way to run it (Python, TensorRT engines): nothing to measure or cache.
            row = {"plan": plans[0].id, "status": "ok", "latency_ms": None, "throughput": None,
                   "max_abs_error": None, "reason": "the only way to run this model here"}
            objective = _parameter(context.config, "objective") or "latency"
            only = build_decision(context, self._hardware.fingerprint, objective, plans[0], plans[0].id, [row],
                                  ONLY_PLAN)
            return Choice(plans[0], only, "off", None)
        with self._tuning:
            if self._isolate:
                return self._tune_in_child(info, context, key, request)
            return self._tune(info, context, plans, skipped, key, progress, request.traffic)

    def _cached(self, key: str, context: LoadContext) -> Choice | None:
        """The cached choice for ``key``; a decision this daemon cannot read is a miss."""
        assert self._cache is not None
        entry = self._cache.lookup(key)
        if entry is None:
            return None
        try:
            plan = plan_from(entry.decision)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            removed = ""
            if self._cache.writable:
                with contextlib.suppress(OSError):
                    self._cache.remove([key])
                    removed = ", removed"
            self._note("cache_entry_unreadable",
                       f"the cached decision for model {context.model_name!r} version {context.version} "
                       f"(entry {key}) has no usable plan ({type(exc).__name__}: {exc}): measuring again{removed}",
                       "nothing to do when it was removed; otherwise `appliance cache clear` once the state dir "
                       "is writable")
            return None
        return Choice(plan, entry.decision, "hit", entry.artefacts)

    def _note(self, kind: str, message: str, fix: str) -> None:
        if self._state is not None:
            self._state.note(kind, message, fix)
        else:  # a tuning child: the daemon that started it reports the problem (as a warning)
            log.info("%s. To fix: %s", message, fix)

    def _unsaved(self, context: LoadContext, reason: str) -> None:
        self._note("cache_not_saved",
                   f"the measured plan of model {context.model_name!r} version {context.version} is served but "
                   f"not cached ({reason}): it is measured again on the next start",
                   "make the state dir writable (see the read_only problem, if any) or free disk space")

    def _tune_in_child(self, info: BackendInfo, context: LoadContext, key: str, request: TuneRequest) -> Choice:
        assert self._cache is not None
        job = TuningJob(info.name, context, self._hardware, self._settings, self._cache.root, self._cache.max_bytes,
                        self._cache.writable, key, request, nice=10 if request.traffic else 0).to_json()
        try:
            # The child's log lines (its progress) go to the daemon's stderr as they are written: a long
            # tuning stays visible while it runs. Only the outcome comes back on stdout.
            result = subprocess.run([sys.executable, "-m", "appliance.selection.worker"], input=job,
                                    stdout=subprocess.PIPE, text=True, timeout=3600)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"model {context.model_name!r}: tuning took longer than an hour") from None
        lines = result.stdout.strip().splitlines()
        outcome: dict[str, Any] = (json.loads(lines[-1]) if lines
                                   else {"ok": False, "error": f"exit code {result.returncode}"})
        if not outcome.get("ok"):
            raise ConfigError(f"model {context.model_name!r}: tuning failed: {outcome.get('error')} "
                              f"(tuning process exit code {result.returncode})")
        assert self._cache is not None
        entry = self._cache.lookup(key)
        if entry is not None:
            return Choice(plan_from(entry.decision), entry.decision, "miss", entry.artefacts)
        if not isinstance(outcome.get("decision"), dict):
            raise ConfigError(f"model {context.model_name!r}: the tuning process stored no decision")
        # Measured but not stored (a read-only or full disk): serve the plan, without cached artefacts.
        self._unsaved(context, "the model cache is read-only" if not self._cache.writable
                      else "the tuning process could not store it; its log above says why")
        return Choice(plan_from(outcome["decision"]), outcome["decision"], "miss", None)

    def _tune(self, info: BackendInfo, context: LoadContext, plans: list[Plan], skipped: dict[str, str],
              key: str, progress: Progress | None, traffic: dict[str, Any] | None) -> Choice:
        config = context.config
        objective = _parameter(config, "objective") or "latency"
        if objective not in ("latency", "throughput"):
            raise ConfigError(f"model {config.name!r}: objective must be latency or throughput, got {objective!r}")
        candidates = tuning_inputs(config, context.version_dir.parent, self._settings.dynamic_sizes, traffic=traffic)
        search = InputSearch(context.model_name, candidates, [o.name for o in config.output])
        batching = config.HasField("dynamic_batching") and config.max_batch_size > 1
        report = _Progress(context.model_name, len(plans) + batching, progress or self.progress)
        with (self._cache.staging() if self._cache is not None else _scratch()) as staging:
            bench = CandidateBench(self._backends, info, context, search, staging,
                                   lambda plan: _tolerance(config, plan, self._settings), self._settings.budget,
                                   self._settings.build_timeout, (traffic or {}).get("concurrency", 0))
            results: list[dict[str, Any]] = []
            for plan in plans:
                report(f"building {plan.id}")
                results.append(bench.measure(plan))
                report.result(results[-1])
            bench.confirm(results, plans, objective)
            results += [{"plan": p, "status": "skipped", "reason": r} for p, r in skipped.items()]
            # A pinned plan serves once it measured (and matched the reference); the reference only when
            # no pinned candidate could.
            pinned = _pinned(config)
            pinned_ids = {p.id for p in plans if pinned and pinned in (p.id, p.base)}
            chosen = best([r for r in results if r["plan"] in pinned_ids], objective) or best(results, objective)
            if chosen is None and not search.tried_on:
                reasons = "; ".join(f"{r['plan']}: {r.get('reason')}" for r in results)
                raise ConfigError(f"model {context.model_name!r}: no plan can load it here ({reasons})")
            # Nothing measured: the config's default plan serves, as --no-selection serves the model.
            # Nothing measured (e.g. a Python model that calls other models, which a tuning process cannot
            # serve): the plan the config pins, else the config's default plan.
            plan = (next((p for p in plans if p.id == chosen), None)
                    or next((p for p in plans if pinned and pinned in (p.id, p.base)), None)
                    or Plan(DEFAULT_PLAN, info.name))
            outcome = measured_outcome(search, chosen is not None, traffic)
            if chosen is not None and batching:
                report(f"measuring {plan.id} by batch size")
                outcome["batching"] = self._batching(bench, plan, config.max_batch_size)
            decision = build_decision(context, self._hardware.fingerprint, objective, plan, chosen, results,
                                      **outcome)
            report(f"chose {plan.id}", done=True)
            if self._cache is None:
                return Choice(plan, decision, "off", None)
            try:
                entry = self._cache.store(key, decision, staging / plan.id.replace(":", "_").replace("+", "_"))
            except OSError as exc:  # read-only or full: the model is served all the same
                self._unsaved(context, exc.strerror or str(exc))
                return Choice(plan, decision, "miss", None)
        return Choice(plan, decision, "miss", entry.artefacts)


    @staticmethod
    def _batching(bench: CandidateBench, plan: Plan, max_batch_size: int) -> dict[str, Any]:
        """The chosen plan's items/s by batch size, and the cap the batcher gets from it."""
        try:
            rates = bench.batch_curve(plan, max_batch_size)
        except Exception as exc:  # the plan was measured already: serve it uncapped
            log.warning("measuring %s by batch size failed (%s): batches are not capped", plan.id, exc)
            return {"items_per_s": {}, "cap": None, "reason": f"not measured: {exc}"}
        cap = batch_cap(rates, max_batch_size)
        if not rates:
            reason = "not measured: the tuning inputs hold no single-item sample to tile"
        elif cap is None:
            reason = "throughput grows up to the largest batch: not capped"
        else:
            reason = (f"batches above {cap} add no throughput here (within {BATCH_WITHIN:.0%} of the best): "
                      f"the batcher forms at most {cap} unless the config sets preferred_batch_size")
        return {"items_per_s": {str(size): rate for size, rate in rates.items()}, "cap": cap, "reason": reason}


class _Progress:
    """Each tuning step in the log (the daemon's, live from the tuning child) and in ``sink`` (the CLI's
    progress bar)."""

    def __init__(self, model: str, steps: int, sink: Progress | None) -> None:
        self._model, self._steps, self._sink, self._step = model, steps, sink, 0

    def __call__(self, message: str, done: bool = False) -> None:
        # Every step counted up front (each plan, and the batch curve when there is one); the last line
        # reads n/n even when a step was skipped.
        self._step = self._steps if done else min(self._step + 1, self._steps)
        log.info("tuning %s [%d/%d]: %s", self._model, self._step, self._steps, message)
        if self._sink is not None:
            self._sink(message, self._step, self._steps)

    def result(self, row: dict[str, Any]) -> None:
        """What one candidate measured, as the log's next line."""
        if row["status"] == "ok":
            log.info("tuning %s [%d/%d]: %s: %.3f ms at the smallest batch, %.1f items/s with every instance busy",
                     self._model, self._step, self._steps, row["plan"], row["latency_ms"], row["throughput"])
        else:
            log.info("tuning %s [%d/%d]: %s %s: %s", self._model, self._step, self._steps, row["plan"],
                     row["status"], row["reason"])


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A temporary directory when there is no cache to stage into."""
    with tempfile.TemporaryDirectory() as path:
        yield Path(path)
