"""Measured backend selection: which plan runs this model fastest on this box, checked for accuracy."""

from appliance.selection.decision import Choice
from appliance.selection.job import Hardware, SelectionSettings, TuneRequest
from appliance.selection.plans import Plan, enumerate_plans
from appliance.selection.selector import Selector

__all__ = ["Choice", "Hardware", "Plan", "SelectionSettings", "Selector", "TuneRequest", "enumerate_plans"]
