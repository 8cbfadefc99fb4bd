"""``LocalModels.begin``, a backend's call to another model (Triton's BLS), made on the event loop as a
model process's channel makes it: the called model's straight line, its outcome given to the caller's
callback in the step that has it, the version held until then; the awaited path under a deadline, and a
call from another thread, give the same outcomes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.backends.base import ModelCall
from appliance.core.errors import InvalidInput, ModelNotFound, Unavailable
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.streaming import StreamLimits
from appliance.repository.bls import LocalModels
from appliance.repository.config import signature_of
from tests.fakes import FakeBackend

CONFIG = """
name: "double"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]
"""


class _Registry:
    repository = Path("/nonexistent")

    def __init__(self, model: ModelVersion) -> None:
        self.model = model

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        if name != self.model.name:
            raise ModelNotFound(f"no model {name}")
        return self.model


@pytest.fixture
async def served():
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    stats = ModelStats()
    pool = InstancePool("double:1", [FakeBackend(delay=0.02)])
    model = ModelVersion("double", 1, config, signature_of(config), named("onnxruntime"),
                         Scheduler("double:1", pool, policy_from_config(config), stats), stats)
    model.start()
    yield model
    await model.close(10)


def _models(model: ModelVersion, deadline: float = 0.0) -> LocalModels:
    models = LocalModels(_Registry(model), explicit=False, limits=StreamLimits(deadline=deadline))  # type: ignore[arg-type]
    models.bind(asyncio.get_running_loop())
    return models


def _call(value: float, model: str = "double", name: str = "x") -> ModelCall:
    return ModelCall(model, {name: np.full((1, 1), value, np.float32)})


def _begun(models: LocalModels, call: ModelCall) -> asyncio.Future:
    """``models.begin(call)`` on the loop, its outcome (told once) in an asyncio future."""
    future = asyncio.get_running_loop().create_future()

    def then(outputs, error):
        assert not future.done(), "an outcome was told twice"
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outputs)

    models.begin(call, then)
    return future


@pytest.mark.parametrize("deadline", [0.0, 30.0], ids=["straight", "awaited"])
async def test_a_call_on_the_loop_gets_its_outputs_and_holds_the_model_until_then(served, deadline):
    models = _models(served, deadline)
    future = _begun(models, _call(3.0))
    await asyncio.sleep(0)  # (an awaited call's task has begun)
    assert served.users == 1
    outputs = await future
    assert outputs["y"].tolist() == [[6.0]]
    assert served.users == 0
    assert served.stats.as_json()["inference_stats"]["success"]["count"] == 1


@pytest.mark.parametrize("deadline", [0.0, 30.0], ids=["straight", "awaited"])
async def test_a_refused_call_gets_its_error_and_lets_the_model_go(served, deadline):
    models = _models(served, deadline)
    with pytest.raises(InvalidInput, match="'z'"):
        await _begun(models, _call(1.0, name="z"))
    with pytest.raises(Unavailable, match="Model nowhere - Error when running inference"):
        await _begun(models, _call(1.0, model="nowhere"))
    assert served.users == 0


async def test_calls_made_together_on_the_straight_line_each_get_their_own_outputs(served):
    models = _models(served)
    futures = [_begun(models, _call(float(value))) for value in range(6)]
    results = [await future for future in futures]
    assert [r["y"][0, 0] for r in results] == [2.0 * value for value in range(6)]
    assert served.users == 0


async def test_a_call_to_a_model_with_a_straight_line_runs_without_a_task_of_its_own(served):
    models = _models(served)
    before = asyncio.all_tasks()
    future = _begun(models, _call(2.0))
    assert asyncio.all_tasks() == before
    assert (await future)["y"].tolist() == [[4.0]]


@pytest.mark.parametrize("deadline", [0.0, 30.0], ids=["straight", "awaited"])
async def test_a_callback_that_raises_is_logged_and_the_model_still_let_go(served, deadline, caplog):
    models = _models(served, deadline)
    told = asyncio.Event()

    def then(outputs, error):
        told.set()
        raise RuntimeError("the caller's callback broke")

    models.begin(_call(1.0), then)
    await asyncio.wait_for(told.wait(), 10)
    await asyncio.sleep(0)
    assert served.users == 0
    assert "a BLS caller's callback failed" in caplog.text
    # The called model goes on serving.
    assert (await _begun(models, _call(5.0)))["y"].tolist() == [[10.0]]


@pytest.mark.parametrize("deadline", [0.0, 30.0], ids=["straight", "awaited"])
async def test_a_call_from_another_thread_runs_on_the_loop_and_tells_its_outcome(served, deadline):
    models = _models(served, deadline)
    loop = asyncio.get_running_loop()

    async def from_a_thread(call: ModelCall):
        outcome = loop.create_future()
        await asyncio.to_thread(models.begin, call,
                                lambda outputs, error: loop.call_soon_threadsafe(outcome.set_result, (outputs, error)))
        return await asyncio.wait_for(outcome, 10)

    outputs, error = await from_a_thread(_call(4.0))
    assert error is None and outputs["y"].tolist() == [[8.0]]
    outputs, error = await from_a_thread(_call(4.0, model="nowhere"))
    assert outputs is None and isinstance(error, Unavailable)


async def test_a_call_from_another_thread_takes_the_straight_line_without_a_task(served, monkeypatch):
    """An in-process model's call hops to the loop once and runs there as the loop's own calls do."""
    models = _models(served)
    loop = asyncio.get_running_loop()
    created = []
    monkeypatch.setattr(loop, "create_task", lambda *args, **kwargs: created.append(args) or None)
    outcome = loop.create_future()
    await asyncio.to_thread(models.begin, _call(2.0),
                            lambda outputs, error: outcome.set_result((outputs, error)))  # (told on the loop)
    outputs, error = await asyncio.wait_for(outcome, 10)
    assert error is None and outputs["y"].tolist() == [[4.0]] and created == []


async def test_a_call_once_the_loop_is_closed_is_told_the_server_is_not_running():
    closed = asyncio.new_event_loop()
    closed.close()
    models = LocalModels(_Registry(None), explicit=False)  # type: ignore[arg-type]
    models.bind(closed)
    told = []
    await asyncio.to_thread(models.begin, _call(1.0), lambda outputs, error: told.append(error))
    assert len(told) == 1 and isinstance(told[0], Unavailable) and "not running" in str(told[0])
