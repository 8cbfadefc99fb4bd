"""Load an ensemble: its plan checked against the composing models the registry has loaded, served by an
``EnsembleScheduler`` in a ``ModelVersion`` (so the request path, statistics and lifecycle treat it like
any other model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.engine.classification import read_labels
from appliance.engine.model import ModelVersion
from appliance.engine.model_files import check_config_paths
from appliance.engine.response_cache import ResponseStore
from appliance.engine.stats import ModelStats
from appliance.repository.config import check_decoupled, select_versions, signature_of
from appliance.repository.ensemble.compose import check_composition
from appliance.repository.ensemble.plan import ENSEMBLE_PLATFORM, EnsemblePlan, Step
from appliance.repository.ensemble.scheduler import EnsembleScheduler, Resolve
from appliance.repository.loader import LoadedModel, version_dirs

__all__ = ["load_ensemble"]


def _complete(config: mc.ModelConfig) -> mc.ModelConfig:
    """What Triton fills in an ensemble's config: its platform, the default version policy and its
    transaction policy (Triton always shows an ensemble's: decoupled when a step is)."""
    completed = mc.ModelConfig()
    completed.CopyFrom(config)
    completed.platform = ENSEMBLE_PLATFORM
    completed.model_transaction_policy.SetInParent()
    if not completed.HasField("version_policy"):
        completed.version_policy.latest.num_versions = 1
    return completed


def load_ensemble(model_dir: Path, config: mc.ModelConfig, plan: EnsemblePlan,
                  config_of: Callable[[Step], mc.ModelConfig], resolve: Resolve,
                  response_cache: ResponseStore | None = None) -> LoadedModel:
    """Every version the ensemble's policy selects (they share the plan: the steps name their own
    versions). Blocking only on the label files; ConfigError names what is wrong. ``response_cache``: the
    server's, which answers the ensemble's requests at the top level when its config enables it."""
    name = model_dir.name
    available = version_dirs(model_dir)
    if not available:
        raise ConfigError(f"ensemble '{name}' has no version directory; create an empty {name}/1 directory "
                          "(an ensemble has no model file, but Triton's layout still wants a version)")
    check_config_paths(config, model_dir, available.values())
    config = _complete(config)
    flow = check_composition(plan, config, config_of)
    # Triton decides it from the steps, whatever the config says: decoupled when any step is.
    config.model_transaction_policy.decoupled = flow.is_decoupled
    check_decoupled(config, "ensemble", True)  # a decoupled ensemble cannot cache its responses (Triton's words)
    labels = {out.name: read_labels(model_dir, out.label_filename, f"output '{out.name}' label_filename")
              for out in config.output if out.label_filename}
    versions = {}
    for version in select_versions(config, available):
        stats = ModelStats()
        versions[version] = ModelVersion(
            name=name, version=version, config=config, signature=signature_of(config), backend=None,
            scheduler=EnsembleScheduler(flow, resolve, stats, config.ensemble_scheduling.max_inflight_requests),
            stats=stats, labels=labels, response_cache=response_cache,
        )
    return LoadedModel(name, config, versions, {})

