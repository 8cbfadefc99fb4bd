"""What a served version records of its traffic for retuning: the concurrency is the requests running in
the model, not those whose responses are still being written (a client sending back to back is 1)."""

from __future__ import annotations

import asyncio

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.types import InferInput, InferRequest
from appliance.repository.config import signature_of
from tests.fakes import FakeBackend

CONFIG = """
name: "double"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [3] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [3] }]
instance_group [{ count: 2 kind: KIND_CPU }]
"""


def _version() -> ModelVersion:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    stats = ModelStats()
    pool = InstancePool("double:1", [FakeBackend(delay=0.05), FakeBackend(delay=0.05)])
    model = ModelVersion("double", 1, config, signature_of(config), named("onnxruntime"),
                         Scheduler("double:1", pool, policy_from_config(config), stats), stats,
                         selection={"status": "unmeasured"})
    model.start()
    return model


def _request() -> InferRequest:
    return InferRequest([InferInput("x", "FP32", np.ones((1, 3), np.float32))], [], "r", {})


async def test_a_request_still_held_after_its_result_is_not_counted_as_concurrent():
    model = _version()
    try:
        for _ in range(5):
            held = model.in_use()  # as a front end holds the version while it writes the response
            with held:
                await model.infer(_request())
                with model.in_use():  # the next request arrives before the first response is written
                    await model.infer(_request())
        assert model.traffic.concurrency() == 1
    finally:
        await model.close(10)


async def test_requests_running_together_are_counted_together():
    model = _version()
    try:
        await asyncio.gather(*(model.infer(_request()) for _ in range(4)))
        assert model.traffic.as_json()["concurrency_p90"] == 4
    finally:
        await model.close(10)
