"""A selection decision: the JSON document kept in the model cache and shown by /selection and
``appliance explain``, built in one place, and the choice a loader serves from it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from appliance.backends import LoadContext
from appliance.backends.base import calls_stopped_tuning
from appliance.selection.inputs import InputSearch
from appliance.selection.plans import DEFAULT_PLAN, Plan

__all__ = ["FIX", "FIX_CALLS", "MEASURED", "ONLY_PLAN", "UNMEASURED", "Choice", "build_decision", "measured_outcome",
           "plan_from"]

MEASURED, UNMEASURED, ONLY_PLAN = "measured", "unmeasured", "only_plan"
FIX = ("add model_warmup samples to config.pbtxt with shapes and data the model accepts, or send it requests: "
       "with retune_on_traffic (the default) it is tuned again on their shapes")
FIX_CALLS = ("nothing to fix for serving: a model that calls other models (BLS) cannot be measured, because the "
             "tuning child serves no models to call; it serves on the config's plan (set parameters in_process to "
             "choose the in-process plan for a model you trust)")


@dataclasses.dataclass(frozen=True)
class Choice:
    plan: Plan
    decision: dict[str, Any]
    cache: str
    """"hit", "miss" or "off"."""
    artefacts: Path | None

    @property
    def measured(self) -> bool:
        """The plan was measured the fastest: serve with it (the other choices serve the config as is)."""
        return self.decision.get("status") == MEASURED

    @property
    def unmeasured(self) -> bool:
        """No candidate could be measured: the model is served on the plan its config pins (``pinned``),
        else on its config's default plan (``plan`` is DEFAULT_PLAN), as ``--no-selection`` serves it."""
        return self.decision.get("status") == UNMEASURED

    @property
    def pinned(self) -> bool:
        """Nothing could be measured, and the config pins ``plan``: serve with it (a Python model that calls
        other models, which a tuning process cannot serve, pinned to the in-process plan)."""
        return self.unmeasured and self.plan.id != DEFAULT_PLAN


def build_decision(context: LoadContext, fingerprint: str, objective: str, plan: Plan, chosen: str | None,
                   candidates: list[dict[str, Any]], status: str, **outcome: Any) -> dict[str, Any]:
    """The decision for ``context``'s model version: ``plan`` serves it (``chosen`` is None when no
    candidate won), ``candidates`` are every plan's row, ``outcome`` what the status needs to explain."""
    return {
        "model": context.model_name,
        "version": context.version,
        "status": status,
        "chosen": chosen,
        "plan": plan.as_json(),
        "objective": objective,
        "hardware_fingerprint": fingerprint,
        **outcome,
        "candidates": candidates,
    }


def measured_outcome(search: InputSearch, measured: bool, traffic: dict[str, Any] | None) -> dict[str, Any]:
    """A measurement's status and its account of what it was tuned on, or why nothing could be measured."""
    outcome: dict[str, Any] = {"tuned_at": time.time(), "inputs_refused": search.refused, "traffic_profile": traffic}
    if measured and search.found is not None:
        return {**outcome, "status": MEASURED, "tuned_on": search.found.source, "profile": search.found.profile()}
    if search.found is None:
        tried = "; ".join(f"{r['inputs']}: {r['reason'][:200]}" for r in search.refused)
        why = f"the model refused every tuning input ({tried})"
    else:
        why = "every candidate plan failed or was rejected on the tuning inputs (see candidates)"
    fix = FIX_CALLS if search.found is None and calls_stopped_tuning(search.refused) else FIX
    return {**outcome, "status": UNMEASURED, "tuned_on": None, "profile": None,
            "reason": f"no candidate plan could be measured: {why}; serving the config's default plan", "fix": fix}


def plan_from(decision: dict[str, Any]) -> Plan:
    """The plan a (cached) decision serves; KeyError, TypeError or ValueError when it has none."""
    plan = decision["plan"]
    return Plan(plan["plan"], plan["backend"], tuple(sorted(plan["parameters"].items())),
                reduced_precision=bool(plan.get("reduced_precision", False)),
                instances=int(plan.get("instances", 0)), threads=int(plan.get("threads", 0)))
