"""Measured backend selection: which plan runs this model fastest on this box, checked for accuracy."""

from appliance.selection.plans import Plan, enumerate_plans
from appliance.selection.selector import Choice, Selector

__all__ = ["Choice", "Plan", "Selector", "enumerate_plans"]
