"""Triton ensembles (``platform: "ensemble"``): a pipeline of models run by the daemon itself.

``plan`` checks the config alone, ``compose`` checks it against the composing models, ``flow`` says how
the responses of decoupled steps flow on, ``run`` takes one request through the steps, ``scheduler``
serves and counts them and ``load`` builds the servable version. The registry orders the loads
(composing models first) and follows unloads (see ``appliance.repository.registry``).
"""

from appliance.repository.ensemble.compose import check_composition
from appliance.repository.ensemble.flow import EnsembleFlow, flow_of
from appliance.repository.ensemble.load import load_ensemble
from appliance.repository.ensemble.plan import ENSEMBLE_PLATFORM, EnsemblePlan, Step, is_ensemble, plan_ensemble
from appliance.repository.ensemble.scheduler import EnsembleScheduler, Resolve

__all__ = [
    "ENSEMBLE_PLATFORM",
    "EnsembleFlow",
    "EnsemblePlan",
    "EnsembleScheduler",
    "Resolve",
    "Step",
    "check_composition",
    "flow_of",
    "is_ensemble",
    "load_ensemble",
    "plan_ensemble",
]
