"""``ModelVersion.begin``, the straight line's way into a version, for a sequence model: its steps are
answered through the callback in order and keep their sequence's state; a withdrawn step still runs
(the next step sees it) and counts as cancelled."""

from __future__ import annotations

import asyncio

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import SequenceScheduler, sequence_policy
from appliance.engine.stats import ModelStats
from appliance.engine.types import InferInput, InferRequest
from appliance.examples.sequence import accumulator_config
from appliance.repository.config import signature_of
from tests.appliance.engine.scheduler.accumulator import Accumulator
from tests.waiting import await_until


def _version(backend: Accumulator) -> ModelVersion:
    config = text_format.Parse(accumulator_config(max_batch_size=4, corrid="UINT64"), mc.ModelConfig())
    config.name = "acc"
    stats = ModelStats()
    scheduler = SequenceScheduler("acc:1", "acc", InstancePool("acc:1", [backend]), sequence_policy(config, None),
                                  stats)
    model = ModelVersion("acc", 1, config, signature_of(config), named("onnxruntime"), scheduler, stats)
    model.start()
    return model


def _step(corrid: int, value: int, start: bool = False, end: bool = False) -> InferRequest:
    return InferRequest([InferInput("INPUT", "INT32", np.full((1, 1), value, np.int32))], [], "",
                        {"sequence_id": corrid, "sequence_start": start, "sequence_end": end})


async def test_a_sequence_model_is_served_on_the_straight_line_and_withdrawn_steps_still_run():
    backend = Accumulator(delay=0.05)
    model = _version(backend)
    told: list[object] = []

    def then(response, error) -> None:
        told.append(error if error is not None else
                    int(next(o.data for o in response.outputs if o.name == "OUTPUT")[0, 0]))

    try:
        assert model.straight
        model.begin(_step(4, 1, start=True), then)
        await await_until(lambda: backend.batches, what="the first step running")
        withdraw = model.begin(_step(4, 10), then)
        assert withdraw() and not withdraw()
        assert len(told) == 1 and isinstance(told[0], asyncio.CancelledError)  # told at once, in that step
        model.begin(_step(4, 100, end=True), then)
        await await_until(lambda: len(told) == 3, what="three outcomes")
        assert told[1:] == [1, 111]
        inference = model.stats.as_json()["inference_stats"]
        assert inference["success"]["count"] == 2 and inference["fail"]["count"] == 1
        assert model.stats.inference_count == 3  # the withdrawn step ran
    finally:
        await model.close(10)
