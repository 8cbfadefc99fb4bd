"""What a measurement that found nothing to measure on tells the operator."""

from __future__ import annotations

from appliance.backends.base import CALLS_UNAVAILABLE
from appliance.selection.decision import FIX, FIX_CALLS, UNMEASURED, measured_outcome
from appliance.selection.inputs import InputSearch


def _refused(*reasons: str) -> InputSearch:
    search = InputSearch("m", [], ["y"])
    search.refused = [{"inputs": f"set {i}", "reason": reason} for i, reason in enumerate(reasons)]
    return search


def test_a_model_refusing_its_inputs_is_told_to_give_better_ones():
    outcome = measured_outcome(_refused("unexpected shape [1, 3]"), measured=False, traffic=None)
    assert outcome["status"] == UNMEASURED and outcome["fix"] == FIX
    assert "unexpected shape [1, 3]" in outcome["reason"]


def test_a_model_stopped_only_by_its_calls_to_other_models_is_told_no_input_would_help():
    bls = f"Failed to process the request(s) for model 'bls_0_0', message: TritonModelException: {CALLS_UNAVAILABLE}"
    outcome = measured_outcome(_refused(bls, bls), measured=False, traffic=None)
    assert outcome["status"] == UNMEASURED and outcome["fix"] == FIX_CALLS
    assert "in_process" in outcome["fix"]
    mixed = measured_outcome(_refused(bls, "unexpected shape [1, 3]"), measured=False, traffic=None)
    assert mixed["fix"] == FIX
