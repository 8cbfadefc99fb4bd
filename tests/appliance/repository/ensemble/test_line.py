"""An ensemble request on the straight line (``ModelVersion.begin`` → ``EnsembleScheduler.enqueue`` →
``EnsembleLine``): its steps begun from callbacks with no task, nesting, a failing step, a client that goes
away midway, and a route the line leaves to the awaited run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.core.errors import InvalidInput
from appliance.engine.types import InferRequest
from appliance.repository.registry import ModelRegistry
from tests.appliance.repository.ensemble.repos import (
    F8,
    X,
    diamond_repository,
    ensemble_config,
    nested_repository,
    parallel_repository,
    request,
    step,
    write_ensemble,
)
from tests.garbage import appliance_cycles
from tests.waiting import await_until


def begin(registry: ModelRegistry, name: str, req: InferRequest):
    """The request begun on the ensemble's line: (a future of its outputs, its withdraw)."""
    model = registry.get(name)
    assert model.straight
    answer: asyncio.Future = asyncio.get_running_loop().create_future()
    held = model.in_use()
    held.__enter__()

    def then(response, error) -> None:
        held.__exit__(None, None, None)
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result({o.name: o.data for o in response.outputs})

    return answer, model.begin(req, then)


async def test_a_diamond_runs_on_the_line_without_a_task(registry_of):
    registry = await registry_of(diamond_repository)
    tasks = asyncio.all_tasks()
    answer, _ = begin(registry, "diamond", request())
    seen: set[asyncio.Task] = set()
    while not answer.done():
        seen |= asyncio.all_tasks()
        await asyncio.sleep(0)
    assert seen <= tasks, seen - tasks  # no task for the request, none for a step
    out = answer.result()
    np.testing.assert_allclose(out["A"], 2 * X + 1)
    np.testing.assert_allclose(out["B"], 2 * X * X)
    stats = registry.get("diamond").stats.as_json()
    assert stats["inference_stats"]["success"]["count"] == 1 and stats["execution_count"] == 1


async def test_a_nested_ensemble_runs_on_the_line_and_its_steps_count_in_both(registry_of):
    registry = await registry_of(nested_repository)
    answer, _ = begin(registry, "outer", request())
    np.testing.assert_allclose((await answer)["FINAL"], 2 * X + 2)
    assert registry.get("chain").stats.success.count == 1
    assert registry.get("plus_one").stats.success.count == 2  # once inside chain, once in outer
    outer = registry.get("outer").stats.as_json()["inference_stats"]
    inner = registry.get("chain").stats.as_json()["inference_stats"]
    assert outer["compute_infer"]["ns"] > inner["compute_infer"]["ns"] > 0  # the inner steps count in the outer


async def test_a_failing_step_fails_the_request_and_the_ensemble_serves_on(registry_of):
    registry = await registry_of(parallel_repository)
    answer, _ = begin(registry, "parallel", request(x=-np.ones((1, 8), np.float32)))
    with pytest.raises(Exception, match="in ensemble 'parallel',") as failed:
        await answer
    assert "negative input" in str(failed.value)
    assert (registry.get("parallel").stats.success.count, registry.get("parallel").stats.fail.count) == (0, 1)
    answer, _ = begin(registry, "parallel", request("A"))
    np.testing.assert_allclose((await answer)["A"], 2 * X)


async def test_a_request_refused_before_any_step_raises_at_once(registry_of):
    registry = await registry_of(diamond_repository)
    with pytest.raises(InvalidInput, match="expected 1 inputs but got 0"):
        begin(registry, "chain", InferRequest([]))
    assert registry.get("double").stats.success.count == 0


async def test_a_client_gone_midway_withdraws_the_steps_running(registry_of):
    registry = await registry_of(parallel_repository)
    answer, withdraw = begin(registry, "parallel", request())
    await await_until(lambda: registry.get("two_outputs").stats.success.count == 1,
                      what="the first step done, the two sleepers begun")
    assert withdraw() is True
    with pytest.raises(asyncio.CancelledError):
        await answer
    assert withdraw() is False  # once
    scheduler = registry.get("parallel").scheduler
    assert scheduler._in_flight == 0
    answer, _ = begin(registry, "parallel", request("B"))  # and the ensemble serves the next request
    np.testing.assert_allclose((await answer)["B"], X * X)
    assert registry.get("parallel").stats.success.count == 1  # the withdrawn one is no success


def _limited_repository(root):
    diamond_repository(root)
    write_ensemble(root, "limited", ensemble_config(
        [("IN", "TYPE_FP32", F8)], [("OUT", "TYPE_FP32", F8)],
        [step("double", {"x": "IN"}, {"y": "OUT"})]).replace(
        "ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1"))
    return root


async def test_a_route_with_step_slots_runs_as_the_awaited_run_behind_the_same_call(registry_of):
    registry = await registry_of(_limited_repository)
    answers = [begin(registry, "limited", request())[0] for _ in range(3)]
    for out in await asyncio.gather(*answers):
        np.testing.assert_allclose(out["OUT"], 2 * X)
    assert registry.get("limited").stats.success.count == 3


def _loose_repository(root):
    diamond_repository(root)  # (double takes [batch, 8])
    write_ensemble(root, "loose", ensemble_config(
        [("IN", "TYPE_FP32", [-1])], [("OUT", "TYPE_FP32", F8)], [step("double", {"x": "IN"}, {"y": "OUT"})]))
    return root


async def test_a_step_refused_at_once_raises_from_begin_and_leaves_nothing_in_flight(registry_of):
    # The ensemble takes any width; its step takes 8: the step's refusal comes in begin itself.
    registry = await registry_of(_loose_repository)
    with pytest.raises(InvalidInput, match="in ensemble 'loose',.*unexpected shape for input 'x'"):
        begin(registry, "loose", request(x=np.ones((1, 4), np.float32)))
    assert registry.get("loose").scheduler._in_flight == 0
    assert registry.get("loose").stats.fail.count == 1
    answer, _ = begin(registry, "loose", request())
    np.testing.assert_allclose((await answer)["OUT"], 2 * X)


async def test_a_request_leaves_no_cycle_for_the_garbage_collector(registry_of):
    # Every object a request made is freed by its last reference (see tests/appliance/rest/test_lane_garbage_e2e).
    registry = await registry_of(diamond_repository)
    for _ in range(5):
        await begin(registry, "chain", request())[0]
    with appliance_cycles() as ours:
        for _ in range(20):
            await begin(registry, "chain", request())[0]
    assert not ours, f"requests left cycles of the daemon's objects: {dict(ours)}"
