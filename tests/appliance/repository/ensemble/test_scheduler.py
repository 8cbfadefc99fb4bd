"""Running ensembles in the core: steps as soon as their inputs exist, branches side by side, nesting,
requested outputs only, step errors, and the traffic each composing model sees and counts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.engine.types import InferInput, InferRequest
from appliance.repository.registry import ModelRegistry
from tests.appliance.repository.ensemble.repos import (
    X,
    diamond_repository,
    nested_repository,
    parallel_repository,
    request,
)
from tests.waiting import await_until


async def infer(registry: ModelRegistry, name: str, req: InferRequest) -> dict[str, np.ndarray]:
    model = registry.get(name)
    with model.in_use():
        response = await model.infer(req)
    return {o.name: o.data for o in response.outputs}


async def test_a_diamond_runs_both_branches_on_the_split_tensors(registry_of):
    registry = await registry_of(diamond_repository)
    out = await infer(registry, "diamond", request())
    np.testing.assert_allclose(out["A"], 2 * X + 1)
    np.testing.assert_allclose(out["B"], 2 * X * X)
    assert registry.get("diamond").platform == "ensemble"


async def test_independent_branches_run_at_the_same_time(registry_of):
    registry = await registry_of(parallel_repository)
    out = await infer(registry, "parallel", request())
    (a_start, a_end), (b_start, b_end) = out["SPAN_A"][0], out["SPAN_B"][0]
    # Each Python step sleeps 0.3 s: run one after the other, one would start after the other ended.
    assert a_start < b_end and b_start < a_end, (out["SPAN_A"][0], out["SPAN_B"][0])
    np.testing.assert_allclose(out["A"], 2 * X)
    np.testing.assert_allclose(out["B"], X * X)


async def test_a_failing_step_fails_the_request_with_its_message_and_stops_nothing_else(registry_of):
    registry = await registry_of(parallel_repository)
    with pytest.raises(Exception) as failed:
        await infer(registry, "parallel", request(x=-np.ones((1, 8), np.float32)))
    assert "in ensemble 'parallel'," in str(failed.value) and "negative input" in str(failed.value)
    stats = registry.get("parallel").stats
    assert (stats.success.count, stats.fail.count) == (0, 1)
    out = await infer(registry, "parallel", request("A"))  # the ensemble still serves
    np.testing.assert_allclose(out["A"], 2 * X)


async def test_a_request_runs_only_the_steps_its_outputs_need(registry_of):
    registry = await registry_of(diamond_repository)
    out = await infer(registry, "chain", request("DOUBLED"))
    assert list(out) == ["DOUBLED"]
    np.testing.assert_allclose(out["DOUBLED"], 2 * X)
    assert registry.get("double").stats.success.count == 1
    assert registry.get("plus_one").stats.success.count == 0  # its branch was not needed
    out = await infer(registry, "chain", request())  # no outputs named: all of them
    assert sorted(out) == ["DOUBLED", "OUT"]


async def test_ensembles_nest(registry_of):
    registry = await registry_of(nested_repository)
    out = await infer(registry, "outer", request())
    np.testing.assert_allclose(out["FINAL"], 2 * X + 2)
    assert registry.get("chain").stats.success.count == 1
    assert registry.get("plus_one").stats.success.count == 2  # once inside chain, once in outer


async def test_ensemble_traffic_batches_with_direct_traffic_and_counts_in_both(registry_of):
    registry = await registry_of(diamond_repository)
    one = X[:1]
    direct = registry.get("double")
    calls = [infer(registry, "chain", request("OUT", x=one)) for _ in range(4)]
    calls += [infer(registry, "double", InferRequest([InferInput("x", "FP32", one)])) for _ in range(4)]
    await asyncio.gather(*calls)
    stats = direct.stats
    assert stats.success.count == 8 and stats.inference_count == 8  # 4 through the ensemble, 4 direct
    assert stats.execution_count < 8 and max(stats.batch_histogram()) > 1  # they ran batched together
    chain = registry.get("chain").stats.as_json()
    assert chain["inference_stats"]["success"]["count"] == 4 and chain["execution_count"] == 4
    assert chain["inference_stats"]["compute_infer"]["count"] == 4  # the sum over its steps, per request
    assert chain["inference_stats"]["compute_infer"]["ns"] > 0


async def test_a_request_that_misses_the_ensemble_input_is_refused_before_any_step(registry_of):
    registry = await registry_of(diamond_repository)
    with pytest.raises(InvalidInput, match="expected 1 inputs but got 0"):
        await infer(registry, "chain", InferRequest([]))
    assert registry.get("double").stats.success.count == 0


def _pinned_repository(root):
    from tests.appliance.repository.ensemble.repos import F8, ensemble_config, step, write_ensemble
    from tests.builders import affine_model, write_model

    for version, scale in ((1, 2.0), (2, 3.0)):
        write_model(root, "scale", affine_model(scale, 0.0), version, "max_batch_size: 8\nversion_policy: { all {} }\n")
    for name, version in (("pinned", 1), ("newest", -1)):
        write_ensemble(root, name, ensemble_config([("IN", "TYPE_FP32", F8)], [("OUT", "TYPE_FP32", F8)],
                                                   [step("scale", {"x": "IN"}, {"y": "OUT"}, version=version)]))
    return root


async def test_a_step_runs_the_version_it_names_or_the_newest(registry_of):
    registry = await registry_of(_pinned_repository)
    np.testing.assert_allclose((await infer(registry, "pinned", request()))["OUT"], 2 * X)
    np.testing.assert_allclose((await infer(registry, "newest", request()))["OUT"], 3 * X)


async def test_a_request_cancelled_midway_leaves_no_step_running(registry_of):
    registry = await registry_of(parallel_repository)
    call = asyncio.create_task(infer(registry, "parallel", request()))
    await await_until(lambda: len([t for t in asyncio.all_tasks() if "_run_step" in repr(t.get_coro())]) == 2,
                      what="both steps running")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    steps = [t for t in asyncio.all_tasks() if "_run_step" in repr(t.get_coro())]
    assert steps == []
    out = await infer(registry, "parallel", request("B"))  # and the ensemble serves the next request
    np.testing.assert_allclose(out["B"], X * X)
