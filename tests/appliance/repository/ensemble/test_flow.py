"""How requests flow through an ensemble with decoupled steps: the frames each step runs in, the levels a
request passes, and Triton's refusal of steps (and outputs) that would mix the responses of different
decoupled models (qa/L0_model_config's invalid_decoupled_branching cases, word for word)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.repository.ensemble import flow_of, plan_ensemble
from tests.appliance.repository.ensemble.repos import ensemble_config, step

IN = ("IN", "TYPE_INT32", [-1])
I1 = [1]


def plan(name: str, inputs, outputs, steps):
    config = text_format.Parse(ensemble_config(inputs, outputs, steps, max_batch_size=0), mc.ModelConfig())
    config.name = name
    return plan_ensemble(config)


def test_a_decoupled_step_opens_the_frame_of_the_steps_after_it():
    chain = plan("rsq", [IN], [("SQ", "TYPE_INT32", I1), ("IDX", "TYPE_UINT32", I1)],
                 [step("repeat", {"IN": "IN"}, {"OUT": "r", "IDX": "IDX"}), step("square", {"X": "r"}, {"Y": "SQ"})])
    flow = flow_of(chain, frozenset({1}))
    assert flow.is_decoupled and dict(flow.frame_of) == {1: 0, 2: 1}
    (first, second), needed = flow.route(frozenset({"SQ", "IDX"}))
    assert [s.model for s in first.steps] == [] and first.fan_out is not None and first.fan_out.model == "repeat"
    assert [s.model for s in second.steps] == ["square"] and second.fan_out is None
    assert needed == {"IN", "r", "IDX", "SQ"}
    (first, second), _ = flow.route(frozenset({"IDX"}))  # the square step is not needed for IDX alone
    assert first.fan_out is not None and second.steps == () and second.fan_out is None


def test_without_decoupled_steps_a_request_has_one_frame():
    chain = plan("rsq", [IN], [("SQ", "TYPE_INT32", I1), ("IDX", "TYPE_UINT32", I1)],
                 [step("repeat", {"IN": "IN"}, {"OUT": "r", "IDX": "IDX"}), step("square", {"X": "r"}, {"Y": "SQ"})])
    flow = flow_of(chain, frozenset())
    assert not flow.is_decoupled
    (only,), _ = flow.route(frozenset({"SQ"}))
    assert [s.model for s in only.steps] == ["repeat", "square"] and only.fan_out is None


def test_decoupled_steps_in_a_row_make_one_level_each():
    chain = plan("rfan", [IN], [("OUT", "TYPE_INT32", I1)],
                 [step("repeat", {"IN": "IN"}, {"OUT": "r"}), step("square", {"X": "r"}, {"Y": "s"}),
                  step("fan", {"X": "s"}, {"OUT": "OUT"})])
    flow = flow_of(chain, frozenset({1, 3}))
    levels, _ = flow.route(frozenset({"OUT"}))
    assert [([s.model for s in level.steps], level.fan_out and level.fan_out.model) for level in levels] == [
        ([], "repeat"), (["square"], "fan"), ([], None)]


REPEAT_MAP = {"IN": "IN", "DELAY": "DELAY", "WAIT": "WAIT"}
REPEAT_INPUTS = [IN, ("DELAY", "TYPE_UINT32", [-1]), ("WAIT", "TYPE_UINT32", I1)]

# qa/L0_model_config/autofill_noplatform/ensemble/invalid_decoupled_branching{,_2}: their configs, and the
# expected text Triton's test matches.
BRANCHING = {
    "invalid_decoupled_branching": (
        [("OUT", "TYPE_INT32", I1)],
        [step("repeat_int32", REPEAT_MAP, {"OUT": "repeat_1_out"}),
         step("repeat_int32", REPEAT_MAP, {"OUT": "repeat_2_out"}),
         step("int32_dim1_nobatch_output2", {"INPUT0": "repeat_1_out", "INPUT1": "repeat_2_out"},
              {"OUTPUT0": "identity_0", "OUTPUT1": "identity_1"}),
         step("int32_dim1_nobatch_output2", {"INPUT0": "identity_0", "INPUT1": "identity_1"}, {"OUTPUT0": "OUT"})],
        frozenset({1, 2}),
        "in ensemble invalid_decoupled_branching, step of model 'int32_dim1_nobatch_output2' receives inputs "
        "originated from different decoupled models"),
    "invalid_decoupled_branching_2": (
        [("OUT", "TYPE_INT32", I1), ("IDX", "TYPE_UINT32", I1)],
        [step("repeat_int32", REPEAT_MAP, {"OUT": "OUT"}), step("repeat_int32", REPEAT_MAP, {"IDX": "IDX"})],
        frozenset({1, 2}),
        "in ensemble invalid_decoupled_branching_2, step of model 'invalid_decoupled_branching_2' receives inputs "
        "originated from different decoupled models"),
    "a step reading the request and a decoupled step": (
        [("OUT", "TYPE_INT32", I1)],
        [step("repeat_int32", REPEAT_MAP, {"OUT": "r"}), step("add", {"A": "r", "B": "WAIT"}, {"Y": "OUT"})],
        frozenset({1}),
        "step of model 'add' receives inputs originated from different decoupled models (step 2 (model 'add') "
        "reads ['WAIT'] from the request; ['r'] from the responses of decoupled step 1 (model 'repeat_int32'))"),
}


@pytest.mark.parametrize("name", sorted(BRANCHING))
def test_a_step_or_output_that_mixes_frames_is_refused_with_triton_words(name):
    outputs, steps, decoupled, words = BRANCHING[name]
    bad = plan(name.replace(" ", "_"), REPEAT_INPUTS, outputs, steps)
    with pytest.raises(ConfigError) as refused:
        flow_of(bad, decoupled)
    assert words in refused.value.message
    assert "feed them from one decoupled step" in refused.value.message  # and the fix
    flow_of(bad, frozenset())  # the same steps answering once are fine
