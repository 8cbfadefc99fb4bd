"""Triton ensembles (``platform: "ensemble"``): a pipeline of models run by the daemon itself.

``plan`` checks the config alone, ``compose`` checks it against the composing models, ``scheduler`` runs
a request through the steps and ``load`` builds the servable version. The registry orders the loads
(composing models first) and follows unloads (see ``appliance.repository.registry``).
"""

from appliance.repository.ensemble.compose import check_composition
from appliance.repository.ensemble.load import load_ensemble
from appliance.repository.ensemble.plan import ENSEMBLE_PLATFORM, EnsemblePlan, Step, is_ensemble, plan_ensemble
from appliance.repository.ensemble.scheduler import EnsembleScheduler, Resolve

__all__ = [
    "ENSEMBLE_PLATFORM",
    "EnsemblePlan",
    "EnsembleScheduler",
    "Resolve",
    "Step",
    "check_composition",
    "is_ensemble",
    "load_ensemble",
    "plan_ensemble",
]
