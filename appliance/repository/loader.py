"""Load one model directory of a Triton-layout repository (blocking: call it off the event loop)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import (
    Backend,
    BackendInfo,
    BackendServices,
    LoadContext,
    RuntimeOptions,
    named,
    resolve_backend,
    threads_per_instance,
)
from appliance.core.errors import ApplianceError, ConfigError
from appliance.engine.classification import read_labels
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.model_files import check_config_paths, confined
from appliance.engine.rate_limiter import RateLimitCounts, instance_needs
from appliance.engine.scheduler import (
    Scheduler,
    SchedulerPolicy,
    SequencePolicy,
    SequenceScheduler,
    policy_from_config,
    sequence_policy,
)
from appliance.engine.scheduler.execution import choose_execution, plan_batch_ns
from appliance.engine.server_wide import ServerWide
from appliance.engine.stats import ModelStats
from appliance.repository.config import (
    check_decoupled,
    complete_config,
    is_ensemble,
    read_config,
    select_versions,
    signature_of,
)
from appliance.repository.layout import content_digest
from appliance.repository.plan_choice import PlanChooser, TuneRequest
from appliance.repository.warmup import run_warmup, warmup_samples

__all__ = ["LoadedModel", "load_model", "version_dirs"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedModel:
    name: str
    config: mc.ModelConfig
    versions: dict[int, ModelVersion]
    failures: dict[int, str]
    """Versions the policy asked for that could not load, with the reason."""


def version_dirs(model_dir: Path) -> dict[int, Path]:
    return {
        int(child.name): child
        for child in model_dir.iterdir()
        if child.is_dir() and child.name.isdigit() and not child.name.startswith("0")
    }


def _instance_count(config: mc.ModelConfig, info: BackendInfo) -> int:
    if not config.instance_group:
        return info.cpu_instances
    return sum(group.count if group.count > 0 else info.cpu_instances for group in config.instance_group)


def _model_file(model_dir: Path, version_dir: Path, filename: str) -> Path:
    path = confined(model_dir, f"{version_dir.name}/{filename}", "default_model_filename")
    if not path.exists():
        raise ConfigError(
            f"model '{model_dir.name}' version {version_dir.name} has no {filename}; "
            f"expected {model_dir.name}/{version_dir.name}/{filename}"
        )
    return path


def _complete(config: mc.ModelConfig, info: BackendInfo, backend: Backend) -> mc.ModelConfig:
    return complete_config(
        config,
        platform=info.platform,
        backend=info.name,
        default_filename=info.default_filename,
        inputs=backend.inputs(),
        outputs=backend.outputs(),
        cpu_instances=info.cpu_instances,
    )


def _rate_limiter(config: mc.ModelConfig) -> mc.ModelRateLimiter | None:
    """The rate_limiter of the config's instance groups (the first that has one), as a copy."""
    for group in config.instance_group:
        if group.HasField("rate_limiter"):
            limiter = mc.ModelRateLimiter()
            limiter.CopyFrom(group.rate_limiter)
            return limiter
    return None


@dataclasses.dataclass(frozen=True)
class _ModelLoad:
    """What loading one model directory shares across its versions."""

    model_dir: Path
    info: BackendInfo
    """The backend its config (or its files) asks for."""
    options: RuntimeOptions
    selector: PlanChooser | None
    retune: bool
    """Measure again even where a decision is cached."""
    explicit_instances: bool
    """The user's config set instance_group (before auto-completion added one)."""
    services: BackendServices | None = None
    """What the daemon lends backends (see LoadContext.services)."""
    server: ServerWide = ServerWide()
    """The response cache and rate limiter every version shares."""


def _load_version(
    load: _ModelLoad, version: int, version_dir: Path, config: mc.ModelConfig, traffic: dict | None,
    stats: ModelStats | None = None,
) -> tuple[mc.ModelConfig, ModelVersion]:
    """Load every instance of one version: the first instance's tensors complete the config, the
    selector (when there is one) picks the plan the instances then run (and, on the CPU, how many
    instances with how many threads, unless the user's config set instance_group). ``traffic``: the
    traffic profile to tune this version on (a retune on real traffic, see appliance.repository.retune);
    ``stats``: the statistics it counts on from (the version it replaces, in a retune), else new ones."""
    model_dir, info, options, selector = load.model_dir, load.info, load.options, load.selector
    # A backend that reads no file (identity) is told where its version directory is all the same.
    model_file = (_model_file(model_dir, version_dir, config.default_model_filename or info.default_filename)
                  if info.reads_file else version_dir / "model")
    instances: list[Backend] = []
    count = _instance_count(config, info)
    threads = threads_per_instance(options, count)

    def context(index: int, cfg: mc.ModelConfig, artefacts: Path | None = None, plan: str = "") -> LoadContext:
        return LoadContext(model_dir.name, version, model_file, cfg, options, index, threads, artefacts,
                           services=load.services, plan=plan)

    selection: dict | None = None
    target = info
    label = f"{model_dir.name}:{version}"
    stats = stats if stats is not None else ModelStats()
    limits = None
    try:
        first = info.load(context(0, config))
        instances.append(first)
        config = _complete(first.completed_config(config), info, first)
        check_decoupled(config, info.name, info.decoupled)  # auto_complete_config may have set the policy
        warmup = warmup_samples(config, model_dir)  # a broken sample fails the load before any tuning
        plan_config, artefacts, plan = config, None, ""
        if selector is not None:
            request = TuneRequest(load.explicit_instances, traffic)
            choice = selector.choose(info, context(0, config), force=load.retune, request=request)
            selection = {**choice.decision, "cache": choice.cache}
            if choice.unmeasured:
                log.warning("model %s version %d: %s. To fix: %s", model_dir.name, version,
                            choice.decision.get("reason"), choice.decision.get("fix"))
            # Serve with the chosen plan (and its cached artefacts); with nothing measured, with the plan
            # the config pins (a Python model that calls other models, pinned in-process), if it pins one.
            if choice.measured or choice.pinned:
                first.close()
                instances.clear()
                target = named(choice.plan.backend)
                plan_config, artefacts, plan = choice.plan.apply(config), choice.artefacts, choice.plan.id
                if choice.plan.instances:  # the served config says how many instances really run
                    limiter = _rate_limiter(config)
                    del config.instance_group[:]
                    config.instance_group.extend(plan_config.instance_group)
                    for group in config.instance_group if limiter is not None else ():
                        group.rate_limiter.CopyFrom(limiter)  # the measured instances keep what they hold
                    count = choice.plan.instances
                    threads = choice.plan.threads or threads_per_instance(options, count)
        check_decoupled(config, target.name, target.decoupled)
        for index in range(len(instances), count):
            instances.append(target.load(context(index, plan_config, artefacts, plan)))
        for backend in instances:
            backend.configure(config)
        run_warmup(instances, warmup, config, version)
        for backend in instances:
            backend.check_ready()
        labels = {
            out.name: read_labels(model_dir, out.label_filename, f"output '{out.name}' label_filename")
            for out in config.output if out.label_filename
        }
        policy: SchedulerPolicy | SequencePolicy = (
            sequence_policy(config, model_dir) if config.HasField("sequence_batching") else policy_from_config(config)
        )
        cap = ((selection or {}).get("batching") or {}).get("cap")
        if isinstance(policy, SchedulerPolicy) and policy.dynamic and not policy.preferred_batch_sizes and cap:
            policy = dataclasses.replace(policy, batch_cap=int(cap))  # selection measured no gain above it
        if load.server.rate_limiter is not None:  # last: a refusal here leaves nothing registered
            stats.rate_limiter = stats.rate_limiter or RateLimitCounts()
            limits = load.server.rate_limiter.register(label, instance_needs(config, len(instances)),
                                                       stats.rate_limiter)
    except BaseException:
        for backend in instances:
            backend.close()
        raise
    # Batches that cannot grow by waiting (no dynamic batching) are handed on as soon as they are queued,
    # to a backend that can queue them (a model process): it never waits for the daemon between them. Not
    # under the rate limiter, whose resources count one execution per instance.
    pipelined = isinstance(policy, SchedulerPolicy) and not policy.dynamic and limits is None
    pool = InstancePool(label, instances, limits, min(b.pipeline_depth for b in instances) if pipelined else 1)
    safe = [target.in_process if backend.inline_safe is None else backend.inline_safe for backend in instances]
    refusal = next((backend.inline_refusal for backend in instances if backend.inline_safe is False), "")
    execution = choose_execution(plan_batch_ns(selection), options.thread_hop_ns, all(safe),
                                 holds_gil=all(backend.holds_gil for backend in instances), unsafe_reason=refusal)
    scheduler: Scheduler | SequenceScheduler
    if isinstance(policy, SequencePolicy):  # a sequence's steps run in order, inline or not
        scheduler = SequenceScheduler(label, model_dir.name, pool, policy, stats, execution)
    else:
        group = min(backend.group_limit for backend in instances) if pipelined else 1
        scheduler = Scheduler(label, pool, policy, stats, execution, group)
    cache = load.server.response_cache
    shared_cache = cache is not None and cache.shared and config.response_cache.enable
    model = ModelVersion(
        name=model_dir.name,
        version=version,
        config=config,
        signature=signature_of(config),
        backend=target,
        scheduler=scheduler,
        stats=stats,
        labels=labels,
        selection=selection,
        response_cache=cache,
        content_digest=(content_digest(model_dir, version_dir, config.SerializeToString(deterministic=True))
                        if shared_cache else None),
    )
    return config, model


def load_model(
    model_dir: Path,
    options: RuntimeOptions,
    selector: PlanChooser | None = None,
    retune: bool = False,
    config_override: mc.ModelConfig | None = None,
    traffic: dict[int, dict] | None = None,
    services: BackendServices | None = None,
    server: ServerWide | None = None,
    statistics: Mapping[int, ModelStats] | None = None,
) -> LoadedModel:
    """Parse, auto-complete and load every version the policy selects.

    A model-level problem (config, no versions, unknown backend) raises ConfigError; a version that
    fails to load is recorded in ``failures`` while the others load. ``traffic``: per version, the
    traffic profile to tune it on (a retune on real traffic, see appliance.repository.retune).
    ``statistics``: per version, the statistics a version counts on from (a retune switches the plan
    of versions already serving: their counters go on, see ModelRegistry.retune); others start at 0.
    """
    if config_override is not None:  # the load API's parameters.config replaces config.pbtxt
        config = mc.ModelConfig()
        config.CopyFrom(config_override)  # already checked by config_from_json, as read_config checks
    else:
        config = read_config(model_dir)
    if is_ensemble(config):
        steps = sorted({step.model_name for step in config.ensemble_scheduling.step})
        raise ConfigError(f"model '{model_dir.name}' is an ensemble: it runs no backend of its own to load or "
                          f"tune alone; the daemon serves it, and its composing models {steps} are the ones to tune")
    available = version_dirs(model_dir)
    if not available:
        raise ConfigError(
            f"model '{model_dir.name}' has no version directory; expected "
            f"{model_dir.name}/1/<model file> (e.g. {model_dir.name}/1/model.onnx)"
        )
    check_config_paths(config, model_dir, available.values())
    info = resolve_backend(model_dir.name, config.backend, config.platform, list(available.values()))
    config.name = config.name or model_dir.name
    check_decoupled(config, info.name, info.decoupled)  # before any instance loads
    load = _ModelLoad(model_dir, info, options, selector, retune, explicit_instances=bool(config.instance_group),
                      services=services, server=server or ServerWide())
    selected = select_versions(config, available)
    versions: dict[int, ModelVersion] = {}
    failures: dict[int, str] = {}
    completed: mc.ModelConfig | None = None
    # The newest version auto-completes the config (as Triton does); the rest are checked against it.
    for version in reversed(selected):
        try:
            completed_here, model = _load_version(load, version, available[version], completed or config,
                                                  (traffic or {}).get(version), (statistics or {}).get(version))
        except ApplianceError as exc:
            failures[version] = exc.message
            log.warning("model %s version %d failed to load: %s", model_dir.name, version, exc.message)
            continue
        except Exception as exc:  # a runtime's own error type: still only this version fails
            failures[version] = f"{type(exc).__name__}: {exc}"
            log.exception("model %s version %d failed to load", model_dir.name, version)
            continue
        completed = completed or completed_here
        versions[version] = model
    if not versions:
        reasons = "; ".join(f"version {v}: {r}" for v, r in sorted(failures.items()))
        raise ConfigError(f"model '{model_dir.name}' has no loadable version ({reasons})")
    return LoadedModel(model_dir.name, completed or config, versions, failures)
