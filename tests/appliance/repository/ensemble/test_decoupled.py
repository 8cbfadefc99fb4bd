"""Decoupled steps in ensembles and decoupled ensembles, in the core (``ModelVersion.open_stream``): every
response of a decoupled step flows on through the steps after it, in order; decoupled steps in a row and
nested decoupled ensembles; an error response or a closed stream stops every step; a slow reader holds a
fast producer back; steps that leave out an output; the sequence parameters Triton puts on each response;
``max_inflight_requests``."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
import pytest_asyncio

from appliance.backends import RuntimeOptions
from appliance.core.errors import InvalidInput
from appliance.engine.streaming import StreamItem, StreamLimits
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.repository.registry import ModelRegistry, ModelState
from tests.appliance.repository.ensemble.decoupled_repos import decoupled_repository
from tests.waiting import await_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]  # ten model processes

ENSEMBLES = ["rsq", "rfan", "outer", "endless_chain", "partial_chain", "partial_out", "tally_chain", "flood",
             "limited"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return decoupled_repository(tmp_path_factory.mktemp("decoupled") / "repo")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def registry(repository):
    registry = ModelRegistry(repository, RuntimeOptions(), drain_timeout=5)
    await registry.load_all(ENSEMBLES)
    assert all(registry.entry(name).state is ModelState.READY for name in ENSEMBLES), [
        (e.name, e.reason) for e in registry.entries()]
    yield registry
    await registry.close(10)


def ints(name: str, values: list[int]) -> InferInput:
    return InferInput(name, "INT32", np.array(values, np.int32))


def request(*inputs: InferInput, outputs: tuple[str, ...] = (), **parameters) -> InferRequest:
    return InferRequest(list(inputs), [RequestedOutput(o) for o in outputs], id="req-1", parameters=parameters)


async def stream(registry: ModelRegistry, name: str, req: InferRequest, limits: StreamLimits | None = None,
                 into: list[StreamItem] | None = None) -> list[StreamItem]:
    """Every item of the stream, appended to ``into`` (when given) as each comes."""
    items = [] if into is None else into
    model = registry.get(name)
    with model.in_use():
        responses = await model.open_stream(req, limits)
        try:
            async for item in responses:
                items.append(item)
            return items
        finally:
            responses.close()


def values(items: list[StreamItem], name: str) -> list[int]:
    return [int(o.data[0]) for item in items if item.response is not None
            for o in item.response.outputs if o.name == name]


def check_ends_once(items: list[StreamItem]) -> None:
    assert [item.final for item in items].count(True) == 1 and items[-1].final
    assert all(item.error is None for item in items)


async def test_each_response_of_a_decoupled_step_runs_the_steps_after_it_in_order(registry):
    before = registry.get("slow_square").stats.success.count
    items = await stream(registry, "rsq", request(ints("IN", [3, 1, 2])))
    check_ends_once(items)
    # slow_square takes 0.3 s for 3 and 0.1 s for 1 on two instances: 1 is squared first, yet answers second
    assert values(items, "SQ") == [9, 1, 4] and values(items, "IDX") == [0, 1, 2]
    assert registry.get("slow_square").stats.success.count == before + 3
    assert registry.get("rsq").config.model_transaction_policy.decoupled  # as Triton completes the config
    with registry.get("rsq").in_use(), pytest.raises(InvalidInput, match="decoupled"):
        await registry.get("rsq").infer(request(ints("IN", [1])))


async def test_every_response_carries_the_request_sequence_as_triton_sends_it(registry):
    items = await stream(registry, "rsq", request(ints("IN", [1, 2]), sequence_id=7, sequence_start=True))
    answers = [item.response for item in items if item.response is not None and item.response.outputs]
    assert [a.parameters for a in answers] == [{"sequence_id": 7, "sequence_start": True, "sequence_end": False}] * 2
    items = await stream(registry, "rsq", request(ints("IN", [5]), outputs=("IDX",)))
    answers = [item.response for item in items if item.response is not None and item.response.outputs]
    assert [[o.name for o in a.outputs] for a in answers] == [["IDX"]]  # only the branch IDX needs ran
    assert answers[0].parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


async def test_a_request_that_makes_no_response_gets_the_final_flag_alone(registry):
    items = await stream(registry, "rsq", request(ints("IN", [])))
    assert [(item.response, item.error, item.final) for item in items] == [(None, None, True)]


async def test_decoupled_steps_in_a_row_fan_out_twice(registry):
    items = await stream(registry, "rfan", request(ints("IN", [2, 1, 3])))
    check_ends_once(items)
    assert values(items, "OUT") == [2, 2, 1, 3, 3, 3]


async def test_a_decoupled_ensemble_is_a_decoupled_step_of_another(registry):
    items = await stream(registry, "outer", request(ints("IN", [2, 3])))
    check_ends_once(items)
    assert values(items, "OUT") == [2, 2, 3, 3, 3]
    assert registry.get("outer").config.model_transaction_policy.decoupled


async def test_an_error_response_ends_the_stream_with_the_step_error(registry):
    before = registry.get("rsq").stats.fail.count
    items = await stream(registry, "rsq", request(ints("IN", [1, -1, 2])))
    assert items[-1].final and items[-1].error is not None
    assert items[-1].error.message == "in ensemble 'rsq', negative value at 1"
    assert all(item.error is None for item in items[:-1]) and values(items, "SQ") in ([], [1])
    assert registry.get("rsq").stats.fail.count == before + 1
    items = await stream(registry, "rsq", request(ints("IN", [2])))  # and the ensemble serves on
    assert values(items, "SQ") == [4]


async def _read_then_close(registry: ModelRegistry, name: str, req: InferRequest, count: int) -> list[StreamItem]:
    model = registry.get(name)
    with model.in_use():
        responses = await model.open_stream(req)
        try:
            return [await anext(responses) for _ in range(count)]
        finally:
            responses.close()  # before the final response: the request is cancelled


async def _wait_for(predicate, seconds: float = 30) -> bool:
    return bool(await await_until(predicate, seconds))


async def test_closing_the_stream_cancels_the_decoupled_step(registry, repository):
    marker = repository / "endless" / "cancelled.txt"
    before = registry.get("endless_chain").stats.fail.count
    req = request(ints("IN", [1]))
    req.id = "gone-core"
    items = await _read_then_close(registry, "endless_chain", req, 3)
    assert values(items, "OUT") == [100, 101, 102]
    assert await _wait_for(lambda: marker.exists() and "gone-core" in marker.read_text())  # is_cancelled() seen
    assert await _wait_for(lambda: registry.get("endless_chain").stats.fail.count == before + 1)


async def test_a_cancelled_request_task_cancels_the_decoupled_step(registry, repository):
    marker = repository / "endless" / "cancelled.txt"
    req = request(ints("IN", [1]))
    req.id = "gone-task"
    received: list[StreamItem] = []
    reading = asyncio.create_task(stream(registry, "endless_chain", req, into=received))
    assert await _wait_for(lambda: received)  # the step runs: its responses flow
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    assert await _wait_for(lambda: marker.exists() and "gone-task" in marker.read_text())


async def test_a_slow_reader_holds_a_fast_decoupled_step_back(registry, repository):
    progress = repository / "producer" / "progress.txt"
    limits = StreamLimits(max_responses=2, stall_timeout=30)
    model = registry.get("flood")
    with model.in_use():
        responses = await model.open_stream(request(ints("IN", [300])), limits)
        try:
            first = await anext(responses)
            await asyncio.sleep(2)  # read nothing more: the producer must wait, not run ahead
            sent = int(progress.read_text())
            # the client's channel (2), the frames open on the step's stream (2), the step's channel (2), and
            # the responses in hand or in flight between them
            assert sent <= 12, sent
            rest = [item async for item in responses]
        finally:
            responses.close()
    assert values([first, *rest], "OUT") == [100 + i for i in range(300)]
    assert int(progress.read_text()) == 300


async def test_a_step_that_leaves_out_an_output_passes_nothing_on_for_it(registry):
    model = registry.get("partial_chain")
    with model.in_use():
        response = await model.infer(request(ints("X", [5])))
    assert [(o.name, int(o.data[0])) for o in response.outputs] == [("OUT", 105)]  # pick got no B
    model = registry.get("partial_out")
    with model.in_use():
        both = await model.infer(request(ints("X", [5])))
        only_b = await model.infer(request(ints("X", [5]), outputs=("B",)))
    assert [(o.name, int(o.data[0])) for o in both.outputs] == [("A", 5)]
    assert both.parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    assert (only_b.outputs, only_b.parameters) == ([], {})  # as Triton: nothing produced, no parameters


async def test_a_step_response_naming_a_sequence_drives_the_steps_after_it(registry):
    items = await stream(registry, "tally_chain", request(ints("IN", [1, 2, 3])))
    check_ends_once(items)
    assert values(items, "SUM") == [1, 3, 6] and values(items, "CORRID") == [42, 42, 42]
    assert values(items, "FLAGS") == [1, 0, 2]  # START, then END, as the tokens step set them
    answers = [item.response.parameters for item in items if item.response is not None and item.response.outputs]
    assert [(a["sequence_id"], a["sequence_start"], a["sequence_end"]) for a in answers] == [
        (42, True, False), (42, False, False), (42, False, True)]


async def test_max_inflight_requests_bounds_a_step_across_requests(registry):
    async def span(name: str) -> tuple[float, float]:
        model = registry.get(name)
        with model.in_use():
            response = await model.infer(request(ints("X", [1])))
        start, end = response.outputs[0].data
        return start, end

    direct = await asyncio.gather(span("span"), span("span"))  # two instances: side by side
    assert direct[0][0] < direct[1][1] and direct[1][0] < direct[0][1], direct
    (a_start, a_end), (b_start, b_end) = await asyncio.gather(span("limited"), span("limited"))
    assert a_end <= b_start or b_end <= a_start, ((a_start, a_end), (b_start, b_end))  # one at a time
