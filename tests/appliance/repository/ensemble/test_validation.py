"""An ensemble that cannot run fails to load with the step and tensor at fault, while the rest of the
repository serves (the cases of Triton's qa/L0_model_config ensemble configs, with our own models)."""

from __future__ import annotations

import pytest

from appliance.backends import RuntimeOptions
from appliance.repository.registry import ModelRegistry, ModelState
from tests.appliance.repository.ensemble.repos import F8, chain_repository, ensemble_config, step, write_ensemble
from tests.builders import affine_model, write_model
from tests.models import copy_model

IN = ("IN", "TYPE_FP32", F8)
OUT = ("OUT", "TYPE_FP32", F8)
GOOD_STEP = step("double", {"x": "IN"}, {"y": "OUT"})

CASES = {
    "no steps": (ensemble_config([IN], [OUT], []), "must specify 'step' for ensemble 'bad'"),
    "no model name": (ensemble_config([IN], [OUT], [step("", {"x": "IN"}, {"y": "OUT"})]),
                      "must specify 'model_name' in step 1 of ensemble 'bad'"),
    "no input map": (ensemble_config([IN], [OUT], [step("double", {}, {"y": "OUT"})]),
                     "must specify 'input_map' in step 1"),
    "no output map": (ensemble_config([IN], [OUT], [step("double", {"x": "IN"}, {})]),
                      "must specify 'output_map' in step 1"),
    "unknown model": (ensemble_config([IN], [OUT], [step("nowhere", {"x": "IN"}, {"y": "OUT"})]),
                      "contains models that are not available or ambiguous: nowhere"),
    "backend set": (ensemble_config([IN], [OUT], [GOOD_STEP], extra='backend: "python"\n'),
                    "must have platform type 'ensemble' and empty backend type"),
    "instance group": (ensemble_config([IN], [OUT], [GOOD_STEP], extra="instance_group [ { count: 2 } ]\n"),
                       "instance group should not be specified for ensemble 'bad'"),
    "input never used": (ensemble_config([IN, ("SPARE", "TYPE_FP32", F8)], [OUT], [GOOD_STEP]),
                         "ensemble input 'SPARE' for ensemble 'bad' is not used"),
    "output never written": (ensemble_config([IN], [OUT, ("LOST", "TYPE_FP32", F8)], [GOOD_STEP]),
                             "output 'LOST' for ensemble 'bad' is not written"),
    "step input written by nothing": (
        ensemble_config([IN], [OUT], [GOOD_STEP, step("plus_one", {"x": "ghost"}, {"y": "X"})]),
        "step 2 (model 'plus_one') reads ensemble tensor 'ghost'"),
    "tensor written twice": (
        ensemble_config([IN], [OUT], [GOOD_STEP, step("plus_one", {"x": "IN"}, {"y": "OUT"})]),
        "ensemble tensor 'OUT' can appear in an output map only once"),
    "two outputs to one tensor": (
        ensemble_config([IN], [OUT], [step("two_outputs", {"x": "IN"}, {"double": "OUT", "square": "OUT"})]),
        "(step 1 (model 'two_outputs') maps two of its outputs to it)"),
    "step reads its own output": (
        ensemble_config([IN], [OUT], [GOOD_STEP, step("two_in", {"a": "IN", "b": "t"}, {"y": "t"})]),
        "step 2 (model 'two_in') reads a tensor it writes itself"),
    "intermediate never read": (
        ensemble_config([IN], [OUT], [GOOD_STEP, step("plus_one", {"x": "IN"}, {"y": "dangling"})]),
        "ensemble tensor 'dangling' is unused in ensemble 'bad'"),
    "steps in a cycle": (
        ensemble_config([IN], [OUT], [step("two_in", {"a": "IN", "b": "t2"}, {"y": "t1"}),
                                      step("double", {"x": "t1"}, {"y": "t2"}),
                                      step("plus_one", {"x": "t1"}, {"y": "OUT"})]),
        "steps wait on each other's outputs in a cycle: step 1 (model 'two_in') -> step 2 (model 'double') -> "
        "step 1"),
    "non-existing input": (ensemble_config([IN], [OUT], [step("double", {"z": "IN"}, {"y": "OUT"})]),
                           "ensemble tensor IN is mapping to non-existing input z in model double"),
    "non-existing output": (ensemble_config([IN], [OUT], [step("double", {"x": "IN"}, {"w": "OUT"})]),
                            "ensemble tensor OUT is mapped from non-existing output w in model double"),
    "data type mismatch": (ensemble_config([("IN", "TYPE_INT32", F8)], [OUT], [GOOD_STEP]),
                           "ensemble tensor IN: inconsistent data type: TYPE_INT32 is inferred from ensemble "
                           "input 'IN' while TYPE_FP32 is inferred from input 'x' of step 1 (model 'double')"),
    "shape mismatch": (ensemble_config([IN], [("OUT", "TYPE_FP32", [4])], [GOOD_STEP]),
                       "ensemble tensor OUT: inconsistent shape: [-1,4] is inferred from ensemble output 'OUT' "
                       "while [-1,8] is inferred from output 'y' of step 1 (model 'double')"),
    "batch larger than a step's": (ensemble_config([IN], [OUT], [GOOD_STEP], max_batch_size=16),
                                   "ensemble bad allows maximum batch size 16, but it contains model double which "
                                   "only allows maximum batch size to be 8"),
    "unbatched step in a batched ensemble": (
        ensemble_config([IN], [OUT], [step("fixed", {"x": "IN"}, {"y": "OUT"})]),
        "contains model fixed which only allows maximum batch size to be 0"),
    "missing version": (ensemble_config([IN], [OUT], [step("double", {"x": "IN"}, {"y": "OUT"}, version=7)]),
                        "ensemble 'bad' depends on 'double' whose required version 7 is not loaded"),
    "self in a step": (ensemble_config([IN], [OUT], [step("bad", {"IN": "IN"}, {"OUT": "OUT"})]),
                       "circular dependency between ensembles: bad -> bad"),
    "through another ensemble": (ensemble_config([IN], [OUT], [step("loop", {"IN": "IN"}, {"OUT": "OUT"})]),
                                 "circular dependency between ensembles: bad -> loop -> bad"),
    "composing model fails": (ensemble_config([IN], [OUT], [step("broken", {"x": "IN"}, {"y": "OUT"})]),
                              "ensemble 'bad' depends on 'broken', which failed to load"),
}


@pytest.fixture
def repo(tmp_path):
    root = chain_repository(tmp_path / "repo")
    write_model(root, "fixed", affine_model(1.0, 0.0), config=(
        'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [-1, 8] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [-1, 8] } ]\n'))
    copy_model(root, "ensemble/two_in")
    write_ensemble(root, "loop", ensemble_config([IN], [OUT], [step("bad", {"IN": "IN"}, {"OUT": "OUT"})]))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    return root


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_bad_ensemble_fails_to_load_with_the_reason_and_the_rest_serves(repo, case):
    config, reason = CASES[case]
    write_ensemble(repo, "bad", config)
    if case != "steps in a cycle":  # the Python step is only needed there (it starts a process)
        (repo / "two_in" / "config.pbtxt").unlink()
        (repo / "two_in" / "1" / "model.py").unlink()
    registry = ModelRegistry(repo, RuntimeOptions(), drain_timeout=2)
    try:
        await registry.load_all(["bad", "chain", "double", "plus_one"])
        bad = registry.entry("bad")
        assert bad.state is ModelState.UNAVAILABLE
        assert reason in bad.reason
        assert registry.entry("chain").state is ModelState.READY  # the rest of the repository serves
        assert not registry.all_ready  # strict readiness: a model that failed is a failure (as Triton)
    finally:
        await registry.close(5)
